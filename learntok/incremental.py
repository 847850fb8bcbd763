"""Incremental inference over a batch of rows: `CachedRows` prefills each row's prompt into the U-Net's caches
(`ByteUNet.prefill`, prompts of one length together; caches of different lengths merged) and then feeds one
byte per row per step (`ByteUNet.step`, or the same step compiled into one graph: `compiled_step`). What
`learntok.generate`, the transformers model's `generate` and lm-eval's greedy decoding
(`eval.scorer.UNetScorer.greedy_batch`) all step through."""

from __future__ import annotations

import itertools
import os
import types
import weakref
from collections.abc import Sequence

import torch

from .data.batch import VOCAB_SIZE


class CachedRows:
    """Key/value caches for B rows generated together: `ByteUNet.prefill` on each row's prompt, then one
    `ByteUNet.step` per byte for all rows. Prompts of the same length are prefilled as one batch; when the
    lengths differ, their caches are then merged (`ByteUNet.merge_inference_caches`) so that every row steps
    in one batch, each at its own position. Each row's boundaries use `uniforms[t]` at its position t.

    `rows`: B prompts (n_b,) starting with BOS; `new`: the bytes each row may still be fed, for all rows
    or per row (a row's cache has room for n_b + new_b positions: a length-dependent strategy such as
    `uniform` spreads its pattern over them); `uniforms`: (positions,) with room for the longest row;
    `compile`: step through `compiled_step`. `logits` (B, V): the next-byte logits after the last byte fed
    (what `learntok.hf` also generates from). Every row is fed a byte at every step, so a row gets at most
    the fewest `new` of any row."""

    def __init__(self, model, rows: Sequence[torch.Tensor], new: int | Sequence[int], uniforms: torch.Tensor,
                 compile: bool = False):
        self.uniforms = uniforms
        device = rows[0].device
        room = [len(r) + (new if isinstance(new, int) else new[b]) for b, r in enumerate(rows)]
        self.logits = torch.zeros(len(rows), VOCAB_SIZE, device=device)
        self.prompt_a, self.prompt_probs = [None] * len(rows), [None] * len(rows)  # per row, (n_b,)
        caches, order = [], []  # the cache's rows are the rows `order` names
        for n, size in sorted({(len(r), size) for r, size in zip(rows, room)}):
            index = [b for b, r in enumerate(rows) if (len(r), room[b]) == (n, size)]
            cache = model.allocate_inference_cache(len(index), size)
            first = model.prefill(torch.stack([rows[i] for i in index]), cache, uniforms=uniforms[:n].expand(len(index), n))
            self.logits[index] = first.logits[:, -1]
            for k, i in enumerate(index):
                self.prompt_a[i], self.prompt_probs[i] = first.a[k], probs_of(first)[k]
            caches.append(cache)
            order += index
        self.cache = caches[0] if len(caches) == 1 else model.merge_inference_caches(caches)
        # the rows in the cache's order, and back (None: the same order)
        self.order = None if order == sorted(order) else torch.tensor(order, device=device)
        self.back = None if self.order is None else torch.argsort(self.order)
        self.step = compiled_step(model, len(rows)) if compile else model.step
        self.a, self.probs = [], []  # (B, 1) per step, in the cache's order

    def append(self, byte: torch.Tensor) -> torch.Tensor:
        """Feed one byte per row, (B,); returns the next logits (B, V)."""
        rows = byte if self.order is None else byte[self.order]
        uniforms = self.uniforms[self.cache.positions()]  # (B,), or one for every row
        # contiguous either way: a compiled step is called without its guards, so with one layout throughout
        uniforms = uniforms.repeat(len(rows)) if uniforms.dim() == 0 else uniforms
        st = self.step(rows, self.cache, uniforms=uniforms)
        self.logits = st.logits[:, -1] if self.back is None else st.logits[self.back, -1]
        self.a.append(st.a)
        self.probs.append(probs_of(st))
        return self.logits

    def boundaries(self, row: int, length: int | None = None) -> tuple[list[bool], list[float]]:
        """Row `row`'s boundary decisions and probabilities at its first `length` positions."""
        k = row if self.order is None else int((self.order == row).nonzero()[0, 0])
        a, probs = [self.prompt_a[row]], [self.prompt_probs[row]]
        if self.a:
            a.append(torch.cat(self.a, 1)[k])
            probs.append(torch.cat(self.probs, 1)[k])
        return torch.cat(a)[:length].tolist(), torch.cat(probs)[:length].tolist()


# Inductor settings of the compiled step: the weights become constants (on a CPU the small matrix products
# are then generated for their shapes: max_autotune), and the graph is called from C++ rather than Python.
# On a GPU, autotuning every matrix product of a large model would take minutes to compile; cuBLAS serves.
# On a CPU autotuning costs about 45 s more compiling for 1.4x the bytes/s at batch 1 (none at 16; the
# demo's config, 2 threads), so Inductor's own TORCHINDUCTOR_MAX_AUTOTUNE=0 turns it off, for short generations.
_STEP_INDUCTOR = {"freezing": True, "cpp_wrapper": True}


def autotunes(device: torch.device) -> bool:
    """Whether the compiled step autotunes its matrix products on `device`: on a CPU, unless the environment
    sets TORCHINDUCTOR_MAX_AUTOTUNE=0."""
    return device.type == "cpu" and os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE", "").strip() != "0"


_compiled_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(B, threads): CompiledStep}


class CompiledStep:
    """`ByteUNet.step` of a fixed model for B rows, compiled with `torch.compile` into one graph: on a CPU
    a step is otherwise hundreds of tiny operations, each costing more to dispatch than to compute. The same
    numbers as `model.step` up to float rounding, the same bytes (tests/test_generation.py).

    One graph serves every byte: what changes from byte to byte is tensor data (the position, from
    `ByteUNet.advance`) or a dynamic size (the token level's slots). What cannot change is fixed when it
    is built: the model and its weights (compiled in as constants), B, boundary draws given as `uniforms`.
    So dynamo checks no guards at each step; `__call__` checks B, `compiled_step` the weights. Compiling
    takes 70-90 s on a CPU (30-50 s without autotuning, `autotunes`), once per process, model, B and thread
    count: worth it for thousands of bytes."""

    def __init__(self, model, batch_size: int):
        self.model = weakref.ref(model)  # kept beside the model (`compiled_step`), not keeping it alive
        self.batch_size = batch_size
        self.weights = _weights_version(model)
        # dynamo keeps compiled graphs with the code object of the function it compiles, across
        # `torch.compile` calls: without guards, another CompiledStep's graph (other weights, other B)
        # would be taken for this one's. So each compiles its own copy of `_step`, as one graph (fullgraph:
        # no inner frame with graphs of its own)
        self.fn = torch.compile(_own_copy(_step), fullgraph=True,
                                options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})
        # read while compiling, at the first call
        self.settings = torch._inductor.config.patch(
            {**_STEP_INDUCTOR, "max_autotune": autotunes(next(model.parameters()).device)})

    def __call__(self, byte: torch.Tensor, cache, uniforms: torch.Tensor):
        """`model.step(byte, cache, uniforms=uniforms)`: byte and uniforms (B,)."""
        if byte.shape != (self.batch_size,) or uniforms.shape != (self.batch_size,):
            raise ValueError(f"this compiled step takes {self.batch_size} rows: bytes and uniforms of shape "
                             f"({self.batch_size},), not {tuple(byte.shape)} and {tuple(uniforms.shape)}")
        model = self.model()
        position = model.advance(cache, byte)
        if self.settings is None:
            return self.fn(model, byte, position, cache, uniforms=uniforms)
        with self.settings:
            out = self.fn(model, byte, position, cache, uniforms=uniforms)
        self.settings = None
        return out


def _step(model, byte, position, cache, uniforms):
    return model.step_at(byte, position, cache, uniforms=uniforms)


_copies = itertools.count()


def _own_copy(function):
    """`function` with a code object of its own (what dynamo keys its compiled graphs on)."""
    code = function.__code__.replace(co_name=f"{function.__name__}_{next(_copies)}")
    return types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)


def compiled_step(model, batch_size: int) -> CompiledStep:
    """The `CompiledStep` of `model` with its current weights for `batch_size` rows and torch's current
    number of threads (built on first use, kept with the model; built again when its weights change)."""
    steps = _compiled_steps.setdefault(model, {})
    key = (batch_size, torch.get_num_threads())  # Inductor's CPU code is generated for the thread count
    step = steps.get(key)
    if step is None or step.weights != _weights_version(model):
        step = steps[key] = CompiledStep(model, batch_size)
    return step


def _weights_version(model) -> tuple:
    """What changes when a weight does: its storage, or its version counter (bumped by in-place updates)."""
    return tuple((p.data_ptr(), p._version) for p in model.state_dict(keep_vars=True).values())


def probs_of(out) -> torch.Tensor:
    """P(boundary) of a prefill's or a step's decisions; the decisions themselves for a strategy without one."""
    return out.probs if out.probs is not None else out.a.float()
