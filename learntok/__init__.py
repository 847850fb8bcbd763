"""learntok: byte-level language models that learn their own tokenization end to end.

Implements "You Can Learn Tokenization End-to-End with Reinforcement Learning" (Dauncey & Wattenhofer,
ICML 2026): an autoregressive U-Net over UTF-8 bytes whose token boundaries are sampled by a small
policy trained with a score-function estimator.

Using a trained model:

    import learntok
    model = learntok.from_pretrained("runs/demo")       # a run, a checkpoint, a saved directory, a Hub repo
    learntok.segment(model, "The quick brown fox.")      # its tokens
    learntok.score(model, "The quick brown fox.").bpb    # bits per byte
    learntok.generate(model, "The ", max_bytes=200, seed=0).text
    learntok.save_pretrained(model, "models/demo")      # learntok.push_to_hub(model, "owner/name")

The model (`ByteUNet`) is a plain `nn.Module`; these functions live beside it, in `learntok.hub`,
`learntok.display` and `learntok.generation`, and are imported on first use so that `import learntok`
(and the command line's help) stays fast. `import learntok.hf` registers the transformers classes
(`AutoModelForCausalLM` and friends; `pip install 'learntok[hf]'`): importing transformers takes seconds,
so `import learntok` alone does not, and saved directories also load with `trust_remote_code=True`.
"""

__version__ = "0.1.0"

_EXPORTS = {  # name -> module that defines it
    "ByteUNet": "learntok.unet",
    "from_pretrained": "learntok.hub",
    "save_pretrained": "learntok.hub",
    "push_to_hub": "learntok.hub",
    "segment": "learntok.display",
    "score": "learntok.generation",
    "generate": "learntok.generation",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'learntok' has no attribute {name!r}")
