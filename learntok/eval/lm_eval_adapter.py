"""learntok models in EleutherAI's lm-evaluation-harness (optional extra: ``pip install 'learntok[eval]'``).

A directory written by ``learntok.save_pretrained`` also runs under lm-eval's stock ``hf`` model
(``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``, see :mod:`learntok.hf`),
with the same per-item log-likelihoods. This adapter adds what the stock model cannot do: scoring a
training run or checkpoint directly, K boundary draws per item (``samples``), thresholded or
calibrated boundaries (``boundaries``), and long documents in half-overlapping windows of the trained
length (the stock model cuts them into disjoint windows with one byte of context each).

Importing this module registers the model class :class:`LearntokLM` under the name ``learntok``.
lm-eval 0.4 (checked up to 0.4.13) discovers models only through its own table
(``lm_eval.models.MODEL_MAPPING``) and through ``@register_model`` in modules that are already
imported: it has no entry-point group for models. So the plain ``lm_eval`` command cannot find
``learntok``; use one of

    python -m learntok.eval.lm_eval_adapter --model learntok --model_args pretrained=runs/demo \\
        --tasks hellaswag,piqa,arc_easy,lambada_openai
    learntok-lm-eval ...                                   # the same, as a console script

    import lm_eval, learntok.eval.lm_eval_adapter          # in Python: import, then use the name
    lm_eval.simple_evaluate(model="learntok", model_args="pretrained=runs/demo", tasks=["hellaswag"])

The command line is lm-eval's own (every ``lm_eval`` option works); this module only registers the
model first. ``--model_args`` (comma-separated ``key=value``):

* ``pretrained`` (required): a run directory, a ``step_*`` checkpoint, a ``save_pretrained`` directory or
  a Hub repo (``owner/name``);
* ``boundaries``: ``sampled`` (default), ``threshold`` or ``quantile``; ``samples`` (K, default 1);
  ``seed`` (default 0); ``calibration``: text source for ``quantile`` (default: the training
  split of the data the run trained on); see :mod:`learntok.eval.scorer`;
* ``max_len`` (default: the run's ``train.seq_len``), ``overlap`` (default ``max_len // 2``);
* ``compile``: ``true`` compiles the model's layers first, as ``learntok eval --compile``.

lm-eval's ``--batch_size`` (rows per forward; ``auto`` means 32) and ``--device`` are honoured.

Requests are scored by the same :class:`~learntok.eval.scorer.UNetScorer` as ``learntok eval``,
with the same position-indexed boundary draws, so for the same context and continuation strings the
log-likelihoods are the same numbers. ``loglikelihood`` returns ``(log p(continuation | context),
is_greedy)`` in nats over the continuation's UTF-8 bytes; ``loglikelihood_rolling`` scores a whole
document in windows (every byte once); lm-eval's ``bits_per_byte`` metric then counts UTF-8 bytes,
as learntok does. ``generate_until`` decodes greedily with the U-Net's caches, ``batch_size`` requests
at a time (`UNetScorer.greedy_batch`); a context is cut from the left so that it and ``max_gen_toks``
bytes fit in the trained length, as lm-eval's own models cut it.
"""

from __future__ import annotations

import logging
import sys

import lm_eval.models  # noqa: F401  (lm-eval fills its registry only when it is empty: do it before we register)
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry, register_model
from tqdm.auto import tqdm

from .benchmarks import score_pairs
from .scorer import UNetScorer

__all__ = ["LearntokLM", "main"]

eval_logger = logging.getLogger(__name__)


def _register(cls):
    """``@register_model("learntok")``, once: ``python -m`` runs this file as ``__main__``, and a
    second copy of the module must not register a second class under the same name."""
    return cls if "learntok" in model_registry else register_model("learntok")(cls)


def _int_or_default(value, default: int) -> int:
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return default
    return int(value)


def _flag(name: str, value) -> bool:
    """A boolean model argument: lm-eval passes True/False, or the string when it did not parse it."""
    if isinstance(value, bool):
        return value
    if str(value).lower() not in ("true", "false"):
        raise ValueError(f"learntok: {name}={value!r}; use true or false")
    return str(value).lower() == "true"


def _encode_pair(context: str, continuation: str) -> tuple[bytes, bytes]:
    """The pair as UTF-8 bytes, with the context's trailing whitespace moved to the start of the continuation,
    as lm-eval's own models do (`TemplateLM._encode_pair`), so that an item scores as under the stock ``hf``
    model."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    return context.encode("utf-8"), continuation.encode("utf-8")


@_register
class LearntokLM(LM):
    """An lm-eval ``LM`` over a learntok run (see the module docstring for the arguments)."""

    def __init__(self, pretrained: str, boundaries: str = "sampled", samples: int = 1, seed: int = 0,
                 max_len: int | None = None, overlap: int | None = None, calibration: str | None = None,
                 batch_size: int | str | None = None, max_batch_size: int | None = None,
                 device: str | None = None, compile: bool | str = False, trust_remote_code: bool | str = False,
                 **unused):
        super().__init__()  # trust_remote_code: lm-eval's own flag, which this model, imported, does not need
        if unused:
            raise ValueError(f"learntok: unknown model_args {sorted(unused)}; see learntok.eval.lm_eval_adapter")
        self.batch_size = _int_or_default(batch_size, 32)
        if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's --device defaults to cuda
            eval_logger.warning("learntok: %s requested but CUDA is not available; using the CPU", device)
            device = "cpu"
        self.scorer = UNetScorer.from_run(pretrained, device=device or "cpu", mode=boundaries,
                                          samples=int(samples), seed=int(seed), batch_size=self.batch_size,
                                          max_len=int(max_len) if max_len else None,
                                          overlap=int(overlap) if overlap is not None else None,
                                          compile=_flag("compile", compile))
        self._device = self.scorer.device
        if self.scorer.needs_calibration:
            from .heldout import read_calibration, run_heldout_source

            try:
                docs, what = read_calibration(calibration, run_heldout_source(self.scorer.run_config))
            except ValueError as e:
                raise ValueError(f"learntok: {e} (calibration=<text source>)") from None
            self.scorer.calibrate(docs, source=what)
        self.pretrained = pretrained

    def get_model_info(self) -> dict:
        """Goes into lm-eval's results["config"]."""
        return {"learntok_run": str(self.pretrained), **self.scorer.describe()}

    # --- the three request types -----------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [_encode_pair(ctx, cont) for ctx, cont in (r.args for r in requests)]
        scores = score_pairs(pairs, self.scorer, self.batch_size, progress=not disable_tqdm, desc="learntok")
        out = []
        for req, s in zip(requests, scores):
            result = (-s.nll_nats, bool(s.greedy_match))
            self.cache_hook.add_partial("loglikelihood", req.args, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs = [(b"", r.args[0].encode("utf-8")) for r in requests]
        scores = score_pairs(pairs, self.scorer, self.batch_size, progress=not disable_tqdm, desc="learntok")
        out = []
        for req, s in zip(requests, scores):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, -s.nll_nats)
            out.append(-s.nll_nats)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations (`UNetScorer.greedy_batch`: with the U-Net's caches, ``batch_size`` requests
        at a time), each cut before its first stop string, as lm-eval expects."""
        asked = []
        for req in requests:
            context, kwargs = req.args
            until = (kwargs or {}).get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            asked.append((context.encode("utf-8"), int((kwargs or {}).get("max_gen_toks", 256)),
                          [u.encode("utf-8") for u in until if u]))
        out = []
        chunk = 8 * self.batch_size  # requests per call, so that the progress bar moves
        with tqdm(total=len(asked), disable=disable_tqdm, desc="learntok generate") as bar:
            for lo in range(0, len(asked), chunk):
                for req, (_, _, stops), new in zip(requests[lo: lo + chunk], asked[lo: lo + chunk],
                                                   self.scorer.greedy_batch(asked[lo: lo + chunk])):
                    text = new.decode("utf-8", errors="replace")
                    for stop in stops:  # the text before the first stop string
                        text = text.split(stop.decode("utf-8"))[0]
                    self.cache_hook.add_partial("generate_until", req.args, text)
                    out.append(text)
                bar.update(len(asked[lo: lo + chunk]))
        return out


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the ``learntok`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
