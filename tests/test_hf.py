"""transformers integration (`learntok.hf`), offline on tiny models written here.

The checks: a saved directory loads through transformers' Auto classes (registered, and through
`trust_remote_code` in a process that never imports learntok) with logits identical to the
`ByteUNet`'s; rows with or without BOS, left- or right-padded, give the logits of the row alone;
`model.generate` (cached or not, greedy or sampling, batch of left-padded prompts) draws the bytes
`learntok.generate` draws; lm-evaluation-harness's stock `hf` model scores every item as learntok's
adapter does."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import learntok  # noqa: E402
import learntok.hf  # noqa: E402,F401  (registers the classes)
from learntok.data.batch import BOS, EOS, PAD  # noqa: E402
from learntok.eval.scorer import UNetScorer, boundary_uniforms  # noqa: E402
from learntok.incremental import CachedRows  # noqa: E402
from learntok.model.layers import softcap  # noqa: E402
from learntok.unet import ByteUNet  # noqa: E402

from conftest import spread_strategy_weights, tiny_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Hello, wörld! ", "Hi", "The quick brown fox jumps over the lazy dog."]


def tiny_unet(name: str = "learned", seed: int = 0) -> ByteUNet:
    torch.manual_seed(seed)
    cfg = tiny_config(name=name)
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    spread_strategy_weights(model, std=1.0)  # a policy far from uniform: boundaries depend on the bytes and the draws
    return model


@pytest.fixture(scope="module", params=["learned", "whitespace", "uniform"])
def saved(request, tmp_path_factory) -> tuple[ByteUNet, Path]:
    unet = tiny_unet(request.param)
    directory = tmp_path_factory.mktemp(f"hf_{request.param}")
    learntok.save_pretrained(unet, directory)
    return unet, directory


def encode(text: str) -> torch.Tensor:
    return torch.tensor([[BOS, *text.encode()]])


def test_auto_classes_load_a_saved_directory(saved):
    unet, directory = saved
    config = AutoConfig.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert type(config).__name__ == "LearntokConfig" and config.boundaries["name"] == unet.boundaries.cfg.name
    assert type(model).__name__ == "LearntokForCausalLM" and not model.training
    assert type(tokenizer).__name__ == "LearntokTokenizer"
    for a, b in zip(unet.state_dict().values(), model.unet.state_dict().values()):
        assert torch.equal(a, b)


def test_logits_equal_the_unet_with_the_eval_draws(saved):
    unet, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    for text in TEXTS:
        ids = encode(text)
        ours = UNetScorer(unet, max_len=model.config.max_position_embeddings)  # the eval draws, as in learntok score
        T = ids.shape[1] if not unet.boundaries.length_dependent else ours.max_len
        padded = torch.full((1, T), PAD)
        padded[:, :ids.shape[1]] = ids
        u = boundary_uniforms(0, T)[None] if unet.boundaries.stochastic else None
        with torch.no_grad():
            expected = unet(padded, uniforms=u).logits[:, :ids.shape[1]]
            got = model(ids).logits
        assert torch.equal(got, expected)


def test_rows_with_padding_or_without_bos_give_the_row_alone(saved):
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    with torch.no_grad():
        alone = [model(encode(t)).logits[0] for t in TEXTS]  # BOS + the text's bytes
        for side in ("left", "right"):  # the tokenizer adds no BOS: the model puts it in front
            tokenizer.padding_side = side
            batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
            logits = model(**batch).logits
            for row, mask, ref in zip(logits, batch["attention_mask"].bool(), alone):
                assert (row[mask] - ref[1:]).abs().max() < 1e-5
                assert not row[~mask].any()
        # rows that bring their own BOS, left-padded by hand
        T = max(len(t.encode()) for t in TEXTS) + 1
        ids = torch.full((len(TEXTS), T), PAD)
        mask = torch.zeros((len(TEXTS), T), dtype=torch.long)
        for r, t in enumerate(TEXTS):
            ids[r, T - len(t.encode()) - 1:] = encode(t)[0]
            mask[r, T - len(t.encode()) - 1:] = 1
        logits = model(ids, attention_mask=mask).logits
        for row, m, ref in zip(logits, mask.bool(), alone):
            assert (row[m] - ref).abs().max() < 1e-5


def test_auto_model_loads_the_model_of_a_subfolder(tmp_path):
    learntok.save_pretrained(tiny_unet("whitespace"), tmp_path / "repo")
    learntok.save_pretrained(tiny_unet("learned"), tmp_path / "repo" / "ckpt")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "repo", subfolder="ckpt", trust_remote_code=True)
    assert model.unet.boundaries.name == "learned"


def test_labels_give_the_next_byte_cross_entropy(saved):
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = encode(TEXTS[2])
    with torch.no_grad():
        out = model(ids, labels=ids)
    logp = torch.log_softmax(out.logits[0, :-1], -1).gather(1, ids[0, 1:, None])
    assert math.isclose(float(out.loss), -float(logp.mean()), rel_tol=1e-5)
    with torch.no_grad():
        loss, logits = model(ids, labels=ids, return_dict=False)  # a tuple, as transformers models give
    assert torch.equal(loss, out.loss) and torch.equal(logits, out.logits)


def test_left_padded_labels_give_the_loss_of_each_row_alone(saved):
    """The tokenizer pads on the left: with labels (a collator's, padding at -100) the loss of a padded batch
    is the one of its rows concatenated, each scored as alone (its first byte has no prediction; the padding
    column before it is not one)."""
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert tokenizer.padding_side == "left" and not batch["attention_mask"].all()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    nll, n = 0.0, 0
    with torch.no_grad():
        padded = float(model(**batch, labels=labels).loss)
        for text in TEXTS:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            nll += float(model(ids, labels=ids).loss) * (ids.shape[1] - 1)
            n += ids.shape[1] - 1
    assert math.isclose(padded, nll / n, rel_tol=1e-5)


def test_a_hand_written_cache_loop_feeds_the_new_bytes_only(saved):
    """transformers' convention: a cached call takes the bytes after those already fed and returns their
    logits; the first returns the prompt's logits at every position. Each equals a full forward pass over
    the bytes so far (uniform spreads its pattern over the room left for generation: other boundaries)."""
    unet, directory = saved
    if unet.boundaries.length_dependent:
        pytest.skip("uniform's cached boundaries are spread over the generation's length, not the row's")
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([list(TEXTS[2].encode())])
    with torch.no_grad():
        out = model(ids[:, :10], use_cache=True)
        assert (out.logits - model(ids[:, :10]).logits).abs().max() < 1e-5
        cache = out[learntok.hf.CACHE]
        for lo, hi in ((10, 11), (11, 12), (12, 15)):  # one byte at a time, then three at once
            out = model(ids[:, lo:hi], **{learntok.hf.CACHE: cache})
            assert out.logits.shape == (1, hi - lo, 259)
            assert (out.logits - model(ids[:, :hi]).logits[:, lo:]).abs().max() < 1e-5
        assert model(ids[:, 15:16], **{learntok.hf.CACHE: cache}, logits_to_keep=1).logits.shape == (1, 1, 259)



@pytest.fixture(scope="module", params=["learned", "whitespace"])
def saved_short(request, tmp_path_factory) -> tuple[ByteUNet, Path]:
    """Saved with its run's config: max_position_embeddings is 63 (train.seq_len 64 less BOS)."""
    unet = tiny_unet(request.param)
    directory = tmp_path_factory.mktemp(f"hf_short_{request.param}")
    learntok.save_pretrained(unet, directory, config=tiny_config(name=request.param))
    return unet, directory


def test_a_hand_written_cache_loop_runs_past_the_trained_length(saved_short):
    """`model(ids, use_cache=True)`, then one byte per call for more than max_position_embeddings bytes
    (generate goes past the trained length too): the cache is made again, larger, and the bytes are
    generate's, where it ran out of room (IndexError) before."""
    _, directory = saved_short
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([list(TEXTS[0].encode())])
    n = model.config.max_position_embeddings + 20
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, new = out[learntok.hf.CACHE], []
        for _ in range(n):
            byte = out.logits[:, -1].argmax(-1, keepdim=True)
            new.append(byte)
            out = model(byte, **{learntok.hf.CACHE: cache})
        reference = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None)
    assert torch.equal(torch.cat(new, 1), reference[:, ids.shape[1]:])


def test_a_cache_made_with_no_room_past_its_prompt_grows_at_the_first_byte(saved_short):
    """A cache sized for the prompt alone (max_length = the prompt's columns) is full before any byte follows
    it: the first byte fed makes it again, larger, from the prompts alone, and the bytes are generate's."""
    _, directory = saved_short
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([list(TEXTS[0].encode())])
    with torch.no_grad():
        cache = learntok.hf.LearntokCache(max_length=ids.shape[1])
        out, new = model(ids, **{learntok.hf.CACHE: cache}), []
        for _ in range(8):
            byte = out.logits[:, -1].argmax(-1, keepdim=True)
            new.append(byte)
            out = model(byte, **{learntok.hf.CACHE: cache})
        reference = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert torch.equal(torch.cat(new, 1), reference[:, ids.shape[1]:])


def test_generate_continues_from_the_cache_it_returned(saved_short):
    """generate(..., return_dict_in_generate=True) hands back its cache, sized for that call; a second
    generate from it (chunked or multi-turn decoding) goes on past the first call's max_new_tokens and
    gives the bytes of one long call."""
    _, directory = saved_short
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(TEXTS[:2], return_tensors="pt", padding=True)
    with torch.no_grad():
        first = model.generate(**batch, max_new_tokens=5, do_sample=False, eos_token_id=None,
                               return_dict_in_generate=True)
        cache = first[learntok.hf.CACHE] if learntok.hf.CACHE in first else first.past_key_values
        mask = torch.cat([batch["attention_mask"], torch.ones(2, 5, dtype=torch.long)], 1)
        second = model.generate(input_ids=first.sequences, attention_mask=mask, **{learntok.hf.CACHE: cache},
                                max_new_tokens=30, do_sample=False, eos_token_id=None)
        whole = model.generate(**batch, max_new_tokens=35, do_sample=False, eos_token_id=None)
    assert torch.equal(second, whole)


def test_int32_input_ids_give_the_same_logits(saved):
    """Embedding layers take int32 ids (numpy arrays, ONNX exports), and so does generate."""
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([list(TEXTS[0].encode())])
    with torch.no_grad():
        assert torch.equal(model(ids.int()).logits, model(ids).logits)

def test_rows_of_the_published_length_keep_each_rows_boundaries(saved):
    """max_position_embeddings is the bytes a row holds beside the BOS the model adds: a row that long in the
    batch leaves a short row's logits as they are alone (uniform's pattern is the trained length's)."""
    unet, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    long_row = (TEXTS[2].encode() * 200)[:model.config.max_position_embeddings]
    batch = torch.full((2, len(long_row)), PAD)
    mask = torch.zeros_like(batch)
    batch[0], mask[0] = torch.tensor(list(long_row)), 1
    short = TEXTS[0].encode()
    batch[1, -len(short):], mask[1, -len(short):] = torch.tensor(list(short)), 1
    trained = learntok.hub.default_context(unet)  # positions, BOS included
    u = boundary_uniforms(0, trained)[None] if unet.boundaries.stochastic else None
    with torch.no_grad():
        logits = model(batch, attention_mask=mask).logits
        alone = model(torch.tensor([list(short)])).logits[0]
        on_the_trained_grid = unet(torch.tensor([[BOS, *long_row]]), uniforms=u).logits[0, 1:]
    assert len(long_row) + 1 == trained
    assert (logits[1, -len(short):] - alone).abs().max() < 1e-5
    assert (logits[0] - on_the_trained_grid).abs().max() < 1e-5


def test_hidden_states_are_the_byte_levels_residual_stream(saved):
    """output_hidden_states: the embeddings, each encoder block, the decoder's input and each decoder block, at
    the given positions of each row as it is alone; the last, normed, gives the logits through the head's
    projection. AutoModel's base model gives that last state."""
    unet, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)  # left-padded
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
        states = out.hidden_states
        assert len(states) == unet.cfg.n_down_layers + unet.cfg.n_up_layers + 2
        assert all(h.shape == (len(TEXTS), mask.shape[1], unet.cfg.d_model) and not h[~mask].any() for h in states)
        assert torch.allclose(states[0][mask], unet.embed(batch["input_ids"][mask]) * math.sqrt(unet.cfg.d_model))
        logits = softcap(unet.head.proj(states[-1]).float(), unet.head.cap)
        assert (logits[mask] - out.logits[mask]).abs().max() < 1e-5
        for row, m, text in zip(range(len(TEXTS)), mask, TEXTS):  # each row's states are its own
            alone = model(torch.tensor([list(text.encode())]), output_hidden_states=True).hidden_states
            assert all((h[row, m] - a[0]).abs().max() < 1e-5 for h, a in zip(states, alone))
        assert model(**batch).hidden_states is None
        base = AutoModel.from_pretrained(directory)
        assert type(base).__name__ == "LearntokModel"
        assert torch.equal(base(**batch).last_hidden_state, states[-1])
        assert all(torch.equal(a, b) for a, b in zip(base(**batch, output_hidden_states=True).hidden_states, states))
        with pytest.raises(NotImplementedError, match="without a cache"):
            model(**batch, use_cache=True, output_hidden_states=True)
        for m in (model, base):
            with pytest.raises(NotImplementedError, match="attention weights are not kept"):
                m(**batch, output_attentions=True)


def _gradients(model, batch) -> list[torch.Tensor]:
    model.zero_grad()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model(**batch, labels=labels).loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_gradient_checkpointing_recomputes_each_block_for_the_same_gradients(saved):
    """transformers' gradient checkpointing runs each block again in the backward pass (one call more per
    block), and the gradients are those without it (eval mode: the same boundary draws in both passes)."""
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    batch = AutoTokenizer.from_pretrained(directory)(TEXTS, return_tensors="pt", padding=True)
    blocks = [b for stack in (model.unet.encoder, model.unet.mid, model.unet.decoder) for b in stack.blocks]
    calls = []
    for block in blocks:  # counted in `forward` (torch's recomputation runs no forward hooks)
        block.forward = lambda *args, forward=block.forward: calls.append(1) or forward(*args)
    kept = _gradients(model, batch)
    assert len(calls) == len(blocks)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert model.gradient_checkpointing
    calls.clear()
    recomputed = _gradients(model, batch)
    assert len(calls) == 2 * len(blocks)  # each block once more in the backward pass
    assert len(kept) == len(recomputed) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(kept, recomputed))
    calls.clear()
    with torch.no_grad():  # nothing to recompute for
        model(**batch)
    assert len(calls) == len(blocks)
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    assert not model.gradient_checkpointing and model.unet.decoder.recompute is None


def test_trainer_fine_tunes_with_gradient_checkpointing(tmp_path):
    pytest.importorskip("accelerate", minversion="1.1.0")  # what transformers' Trainer itself requires
    from transformers import Trainer, TrainingArguments

    learntok.save_pretrained(tiny_unet(), tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    rows = [dict(input_ids=ids, labels=ids) for ids in tokenizer([TEXTS[2]] * 4)["input_ids"]]
    # transformers 5.24 renamed the option activation_checkpointing
    named = "activation_checkpointing" if hasattr(TrainingArguments, "activation_checkpointing") else "gradient_checkpointing"
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
                             use_cpu=True, report_to=[], save_strategy="no", **{named: True})
    before = model.unet.decoder.blocks[0].mlp.down.weight.clone()
    Trainer(model=model, args=args, train_dataset=rows).train()
    assert model.gradient_checkpointing
    assert not torch.equal(before, model.unet.decoder.blocks[0].mlp.down.weight)



def test_trainer_resumes_from_its_checkpoint_with_the_fine_tuned_weights(tmp_path):
    """Trainer's resume_from_checkpoint (and load_best_model_at_end) reads the checkpoint's model.safetensors
    with `model.load_state_dict(state_dict, False)`; the file holds the U-Net's own names, without the
    `unet.` prefix, and nothing was loaded (one logged warning): training went on from the base weights."""
    pytest.importorskip("accelerate", minversion="1.1.0")
    from transformers import Trainer, TrainingArguments

    learntok.save_pretrained(tiny_unet(), tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    rows = [dict(input_ids=ids, labels=ids) for ids in tokenizer([TEXTS[2]] * 4)["input_ids"]]
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
                             use_cpu=True, report_to=[], save_strategy="steps", save_steps=2)
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    Trainer(model=tuned, args=args, train_dataset=rows).train()
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "model")  # the base weights, as a resumed job starts
    resumed = Trainer(model=fresh, args=args, train_dataset=rows)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    for name, value in tuned.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name


def test_transformers_4_is_refused_with_the_version_it_needs():
    """With transformers 4, importing learntok.hf (directly, or through trust_remote_code's learntok_hf.py)
    failed with `TypeError: AutoTokenizer.register() got an unexpected keyword argument`; it says which
    transformers it needs."""
    code = ("import transformers; transformers.__version__ = '4.57.1'\n"
            "try:\n    import learntok.hf\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ImportError: learntok.hf needs transformers 5 or newer (found 4.57.1)" in out.stdout, out.stderr[-2000:]

def test_lora_trains_saves_and_merges(tmp_path):
    """PEFT's LoRA on every linear layer: a step trains the adapters only, generate runs through the wrapper,
    and the saved adapter, reloaded and merged, gives the adapted model's logits."""
    peft = pytest.importorskip("peft")
    learntok.save_pretrained(tiny_unet(), tmp_path / "model")
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(tmp_path / "model"),
                                peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    trained = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)).loss.backward()
    optimizer.step()
    model.eval()
    changed = {n for n, p in model.named_parameters() if n in trained and not torch.equal(p, trained[n])}
    assert any(".decoder." in n for n in changed)  # (the next-byte loss reaches no adapter of the early-exit head)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    out = model.generate(**tokenizer(["The "], return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 9)
    model.save_pretrained(tmp_path / "adapter")
    merged = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "model"),
                                            tmp_path / "adapter").merge_and_unload()
    with torch.no_grad():
        assert (merged(**batch).logits - model(**batch).logits).abs().max() < 1e-4


def test_dtype_auto_loads_the_type_the_weights_were_saved_in(tmp_path):
    """transformers' default dtype="auto": a directory saved in bfloat16 loads in bfloat16 (also one written
    before config.json named its type: the weights say it); learntok's own loader gives float32."""
    learntok.save_pretrained(tiny_unet().to(torch.bfloat16), tmp_path / "bf16")
    learntok.save_pretrained(tiny_unet(), tmp_path / "fp32")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    for load in (lambda d, **kw: AutoModelForCausalLM.from_pretrained(d, **kw), lambda d, **kw: AutoModel.from_pretrained(d, **kw)):
        assert load(tmp_path / "bf16").dtype == torch.bfloat16
        assert load(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16
        assert load(tmp_path / "bf16", dtype=torch.float32).dtype == torch.float32
        assert load(tmp_path / "fp32").dtype == torch.float32
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.config.dtype == torch.bfloat16
    assert next(learntok.from_pretrained(tmp_path / "bf16").parameters()).dtype == torch.float32
    meta = json.loads((tmp_path / "bf16" / "config.json").read_text())
    del meta["dtype"]
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(meta))
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").dtype == torch.bfloat16


def test_from_pretrained_takes_the_boundary_seed_and_learntok_takes_the_model(saved):
    unet, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory, boundary_seed=3)  # AutoModel puts it in the config
    assert model.config.boundary_seed == 3
    ids = encode(TEXTS[2])
    T = ids.shape[1] if not unet.boundaries.length_dependent else model.config.max_position_embeddings + 1
    padded = torch.full((1, T), PAD)
    padded[:, :ids.shape[1]] = ids
    with torch.no_grad():
        expected = unet(padded, uniforms=boundary_uniforms(3, T)[None]).logits[:, :ids.shape[1]]
        assert torch.equal(model(ids).logits, expected)
    # learntok's own functions take the transformers model too
    assert learntok.score(model, TEXTS[2]).bpb == learntok.score(unet, TEXTS[2]).bpb
    assert learntok.segment(model, TEXTS[2]).tokens() == learntok.segment(unet, TEXTS[2]).tokens()
    assert learntok.generate(model, "Hi", max_bytes=5, seed=1).data == learntok.generate(unet, "Hi", max_bytes=5, seed=1).data
    with pytest.raises(NotImplementedError, match="vocabulary is the 256 bytes"):
        model.resize_token_embeddings(300)


def test_a_model_built_from_its_config_saves_what_the_config_knew(tmp_path):
    from test_eval_cli import make_run

    directory = learntok.save_pretrained(learntok.from_pretrained(make_run(tmp_path / "run")), tmp_path / "model")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    model.save_pretrained(tmp_path / "again")
    before, after = (json.loads((d / "config.json").read_text()) for d in (directory, tmp_path / "again"))
    assert after["train"] == before["train"] and after["max_position_embeddings"] == before["max_position_embeddings"]
    assert before["max_position_embeddings"] == before["train"]["seq_len"] - 1


@pytest.mark.parametrize("settings", [dict(temperature=0), dict(), dict(temperature=0.8, top_k=20),
                                      dict(temperature=1.3, top_p=0.9)], ids=["greedy", "plain", "top_k", "top_p"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_generate_draws_the_bytes_of_learntok_generate(saved, settings, use_cache, monkeypatch):
    unet, directory = saved
    prefills = []  # with the cache: one prefill, then a step per byte (not a prefill per byte)
    monkeypatch.setattr(learntok.hf, "CachedRows", lambda *a, **k: prefills.append(1) or CachedRows(*a, **k))
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    n = 60
    ours = learntok.generate(unet, TEXTS[0], max_bytes=n, seed=5, stop_on_eos=True, **settings)
    hf_settings = dict(do_sample=False) if settings.get("temperature") == 0 else dict(do_sample=True, **{"top_k": 0, **settings})
    torch.manual_seed(5)
    prompt = tokenizer(TEXTS[0], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=n, use_cache=use_cache, **hf_settings)
    new = out[0, prompt["input_ids"].shape[1]:].tolist()
    if EOS in new:
        new = new[:new.index(EOS)]
    assert bytes(new) == ours.data
    assert len(ours.data) > 10  # not vacuous
    assert len(prefills) == (1 if use_cache else 0)


def test_input_without_positions_is_a_clear_error(saved):
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    for ids in (torch.zeros(1, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long)):
        with pytest.raises(ValueError, match="input_ids must be \\(batch, length\\) with at least one position"):
            model(ids)


def test_generate_refuses_what_it_cannot_do(saved):
    _, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.tensor([list(b"The ")])
    with pytest.raises(NotImplementedError, match="beam search"):
        model.generate(ids, max_new_tokens=3, num_beams=2)
    with pytest.raises(NotImplementedError, match="assisted decoding"):
        model.generate(ids, max_new_tokens=3, assistant_model=model)


def test_generate_a_left_padded_batch_row_by_row(saved):
    """Prompts of different lengths in one batch: each row generates what it generates alone."""
    unet, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = [TEXTS[0], TEXTS[1], TEXTS[1] + "!"]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=30, do_sample=False)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    for prompt, text in zip(prompts, texts):
        alone = learntok.generate(unet, prompt, max_bytes=30, temperature=0)
        assert text == alone.text


def test_sampling_a_left_padded_batch_draws_what_learntok_draws(saved):
    unet, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = [TEXTS[0], TEXTS[1], TEXTS[1] + "!", TEXTS[2]]
    ours = learntok.generate(unet, prompts, max_bytes=30, seed=11, temperature=0.9)
    torch.manual_seed(11)
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=30, do_sample=True, top_k=0, temperature=0.9)
    for row, gen in zip(out[:, batch["input_ids"].shape[1]:].tolist(), ours):
        assert bytes(row[:row.index(EOS)] if EOS in row else row) == gen.data


def test_tokenizer_is_bytes():
    tokenizer = learntok.hf.LearntokTokenizer()
    text = "naïve <eos> 日本"
    ids = tokenizer(text)["input_ids"]
    assert ids == list(text.encode())  # "<eos>" in a text is its bytes; no BOS (the model adds it)
    assert tokenizer.decode([BOS, *ids, EOS], skip_special_tokens=True) == text
    assert tokenizer.decode([BOS, 0xE6, 0x97]) == "<bos>\ufffd"  # a cut character becomes U+FFFD
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (BOS, EOS, PAD)
    padded = tokenizer(["a", "abc"], padding=True)
    assert padded["input_ids"][0] == [PAD, PAD, ord("a")] and padded["attention_mask"][0] == [0, 0, 1]
    # an id of no token is an error, not chr(id): a labels row's -100 says what it is
    with pytest.raises(ValueError, match="id 300 is neither a byte"):
        tokenizer.decode([104, 300])
    with pytest.raises(ValueError, match="-100 marks the positions a loss ignores"):
        tokenizer.decode([-100, 104])


def test_tokenizer_converts_whole_texts_as_it_converts_token_by_token():
    """Encoding and decoding run a text's bytes through `bytes` at once; each must give what transformers'
    own token-by-token conversion gives, special tokens (kept as text or split into bytes), added tokens,
    cut characters and ids as a tensor included."""
    import numpy as np
    from transformers import PreTrainedTokenizer

    tokenizer = learntok.hf.LearntokTokenizer()
    kept = learntok.hf.LearntokTokenizer(split_special_tokens=False)  # "<eos>" in a text is then EOS
    kept.add_tokens(["<sep>"])
    base = PreTrainedTokenizer  # transformers' token-by-token conversions
    rng = np.random.default_rng(0)
    pool = ["a", "Z", " ", "\n", "\t", "\x00", "\x7f", "é", "€", "😀", "\u0301", "日", "<eos>", "<bos>", "<pad>", "<sep>"]
    texts = ["", " "] + ["".join(rng.choice(pool, size=rng.integers(0, 30))) for _ in range(300)]
    for tok in (tokenizer, kept):
        for text in texts:
            tokens = tok.tokenize(text)
            ids = tok.convert_tokens_to_ids(tokens)
            assert ids == base.convert_tokens_to_ids(tok, tokens)
            assert tok(text)["input_ids"] == ids
            if tok is tokenizer:
                assert ids == list(text.encode())
            assert tok.convert_tokens_to_string(tokens) == text
        for _ in range(300):
            ids = rng.integers(0, len(tok), size=rng.integers(0, 30)).tolist()  # every byte, special and added id
            for skip in (False, True):
                tokens = tok.convert_ids_to_tokens(ids, skip_special_tokens=skip)
                assert tokens == base.convert_ids_to_tokens(tok, ids, skip_special_tokens=skip)
                assert tok.convert_ids_to_tokens(torch.tensor(ids, dtype=torch.long), skip_special_tokens=skip) == tokens
                assert tok.convert_ids_to_tokens(np.array(ids, dtype=np.int64), skip_special_tokens=skip) == tokens
                text = tok.decode(ids, skip_special_tokens=skip)
                reference = b"".join(bytes([ord(t)]) if len(t) == 1 else t.encode() for t in tokens)
                assert text == reference.decode("utf-8", errors="replace")
    assert kept("a<eos>b<sep>")["input_ids"] == [ord("a"), EOS, ord("b"), len(kept) - 1]
    for one in (97, torch.tensor(97), np.int64(97)):  # one id, however given, is one token
        assert tokenizer.convert_ids_to_tokens(one) == "a"
    for texts in ("héllo", ["héllo", "a"]):  # offsets: refused, not left out without a word
        with pytest.raises(NotImplementedError, match="no offsets mapping"):
            tokenizer(texts, return_offsets_mapping=True, padding=True)

def test_trust_remote_code_without_importing_learntok(saved, tmp_path):
    """A user who never imports learntok: the directory's learntok_hf.py does."""
    unet, directory = saved
    script = f"""
import sys, torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
assert "learntok" not in sys.modules
model = AutoModelForCausalLM.from_pretrained({str(directory)!r}, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained({str(directory)!r}, trust_remote_code=True)
out = model.generate(**tokenizer({TEXTS[0]!r}, return_tensors="pt"), max_new_tokens=20, do_sample=False)
base = AutoModel.from_pretrained({str(directory)!r}, trust_remote_code=True)
assert type(base).__name__ == "LearntokModel" and base(**tokenizer("Hi", return_tensors="pt")).last_hidden_state.shape[1] == 2
# saved again, as Trainer saves its checkpoints: the classes loaded through learntok_hf.py save and reload
tokenizer.save_pretrained("again")
model.config.save_pretrained("again")
again = AutoTokenizer.from_pretrained("again", trust_remote_code=True)
assert again("é").input_ids == [195, 169] and AutoConfig.from_pretrained("again", trust_remote_code=True).model
sys.stdout.buffer.write(bytes(t for t in out[0].tolist() if t < 256))
"""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert b"past_key_values" not in proc.stderr  # transformers' own name for the cache: no deprecation warning
    expected = learntok.generate(unet, TEXTS[0], max_bytes=20, temperature=0)
    assert proc.stdout == TEXTS[0].encode() + expected.data[:20]


def test_saved_config_is_learntok_and_transformers(saved):
    unet, directory = saved
    meta = json.loads((directory / "config.json").read_text())
    assert meta["auto_map"]["AutoModelForCausalLM"] == "learntok_hf.LearntokForCausalLM"
    assert (meta["bos_token_id"], meta["eos_token_id"], meta["pad_token_id"]) == (BOS, EOS, PAD)
    again = learntok.from_pretrained(directory)  # learntok's own loader ignores the transformers keys
    assert again.boundaries.cfg == unet.boundaries.cfg
    model = AutoModelForCausalLM.from_pretrained(directory)
    model.save_pretrained(directory / "resaved")
    assert json.loads((directory / "resaved" / "config.json").read_text())["model"] == meta["model"]


# --- lm-evaluation-harness's stock hf model ------------------------------------------------------

def test_lm_eval_hf_matches_the_adapter_per_item(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from test_eval_cli import make_run
    from test_eval_lm_eval import DOCS, write_tasks

    from lm_eval.api.registry import get_model
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    import learntok.eval.lm_eval_adapter  # noqa: F401  (registers "learntok")

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "tasks").mkdir()
    write_tasks(tmp_path / "tasks", tmp_path)
    run = make_run(tmp_path / "run")
    directory = learntok.save_pretrained(learntok.from_pretrained(run), tmp_path / "model")
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    names = ["learntok_piqa", "learntok_rolling"]
    tasks = manager.load(names) if hasattr(manager, "load") else None
    max_len = 512  # one window for every document, in both (lm-eval's windows are not learntok's)
    results = {}
    for name, args in (("learntok", f"pretrained={run},max_len={max_len}"),
                       ("hf", f"pretrained={directory},max_length={max_len},trust_remote_code=True")):
        lm = get_model(name).create_from_arg_string(args, {"batch_size": 4, "device": "cpu"})
        if tasks is None:
            from lm_eval.tasks import get_task_dict

            tasks = get_task_dict(names, manager)
        results[name] = evaluate(lm, tasks, log_samples=True, bootstrap_iters=0)
    for task in names:
        ours = sorted(results["learntok"]["samples"][task], key=lambda s: s["doc_id"])
        theirs = sorted(results["hf"]["samples"][task], key=lambda s: s["doc_id"])
        assert len(ours) == len(theirs) > 0
        for a, b in zip(ours, theirs):
            assert len(a["resps"]) == len(b["resps"])
            for ra, rb in zip(a["resps"], b["resps"]):
                if task == "learntok_piqa":
                    (ll_a, greedy_a), (ll_b, greedy_b) = ra[0], rb[0]
                    assert greedy_a == greedy_b
                else:
                    ll_a, ll_b = ra[0], rb[0]
                assert math.isclose(ll_a, ll_b, rel_tol=1e-5, abs_tol=1e-5)
    assert len(DOCS[1].encode()) > 64  # the rolling task holds a document longer than the trained length


def test_the_readme_example_runs(saved, tmp_path):
    """The README's transformers block, on a small saved model in place of models/demo."""
    import re

    _, directory = saved
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("### With transformers and lm-evaluation-harness", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "models/demo" in code
    namespace = {}
    exec(code.replace("models/demo", str(directory)).replace("max_new_tokens=100", "max_new_tokens=5"), namespace)
    assert namespace["out"].shape[0] == 2


@pytest.mark.slow
def test_lm_eval_command_line_with_the_stock_hf_model(tmp_path):
    """`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True` on a local task."""
    pytest.importorskip("lm_eval")
    from test_eval_cli import make_run
    from test_eval_lm_eval import write_tasks

    (tmp_path / "tasks").mkdir()
    write_tasks(tmp_path / "tasks", tmp_path)
    directory = learntok.save_pretrained(learntok.from_pretrained(make_run(tmp_path / "run")), tmp_path / "model")
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={directory},trust_remote_code=True",
         "--device", "cpu", "--tasks", "learntok_piqa", "--include_path", str(tmp_path / "tasks"),
         "--output_path", str(tmp_path / "out")],
        check=False, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "learntok_piqa" in proc.stdout
