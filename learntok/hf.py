"""learntok models as transformers models (optional extra: ``pip install 'learntok[hf]'``).

Importing this module registers four classes with transformers' Auto classes, under the model type
of every learntok directory (``learntok-byte-unet``):

* :class:`LearntokConfig` (``AutoConfig``): the directory's config.json;
* :class:`LearntokForCausalLM` (``AutoModelForCausalLM``): the U-Net behind transformers' causal-LM
  interface: ``model(input_ids, attention_mask, labels=...)`` and ``model.generate(...)``, with
  ``output_hidden_states`` and gradient checkpointing (``Trainer``, PEFT);
* :class:`LearntokModel` (``AutoModel``): the same U-Net as a base model, whose output is the byte level's
  final states (embeddings, the ``feature-extraction`` pipeline);
* :class:`LearntokTokenizer` (``AutoTokenizer``): UTF-8 bytes as ids 0-255, BOS/EOS/PAD as the model
  uses them.

Every directory `learntok.save_pretrained` writes also carries ``learntok_hf.py`` and an ``auto_map``,
so a user who never imports learntok loads it with ``trust_remote_code=True``::

    model = AutoModelForCausalLM.from_pretrained("models/demo", trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained("models/demo", trust_remote_code=True)
    torch.manual_seed(0)
    out = model.generate(**tokenizer(["The ", "Once upon"], return_tensors="pt", padding=True),
                         max_new_tokens=100, do_sample=True, temperature=0.8)

Loading and saving go through `learntok.hub` (one load path; ``model.unet`` is the `ByteUNet`).

**Boundaries.** In eval mode (what ``from_pretrained`` returns) every row's boundaries are sampled
with the random numbers `learntok score` uses: the position-indexed stream
``eval.scorer.boundary_uniforms(config.boundary_seed, ...)``. A row's boundaries, hence its logits,
depend on its own bytes only, not on its batch or padding, so lm-evaluation-harness's stock ``hf`` model
scores each item as learntok's own adapter does. In training mode the strategy draws fresh random
numbers, and ``labels`` give the next-byte loss only (train with ``learntok train`` for the full
objective with its policy gradient).

**Rows.** Each row is what a tool gives: with or without BOS (BOS is put in front when missing, and
the logits of the given positions are returned), left- or right-padded (``attention_mask``).
``config.max_position_embeddings`` is the trained length less that BOS: the longest row a tool should give.

**Generation** uses the U-Net's own caches, as `learntok.generate` does (:class:`LearntokCache` holds
its `incremental.CachedRows`: every row steps in one batch, whatever its prompt's length). As with any
transformers model, a call with a cache takes the bytes the cache has not seen: the prompts first, then
the bytes that follow, one or several per call.
Greedy and sampling are supported; bytes are drawn by transformers' own processors and
``torch.multinomial``, which `learntok.generate` reproduces: after ``torch.manual_seed(seed)``,
``model.generate(..., do_sample=True, top_k=0)`` draws the bytes ``learntok.generate(unet, prompt,
seed=seed)`` draws (``top_k=0``: transformers samples from the 50 most likely bytes unless told, learntok
from all; with ``top_k=k`` pass the same k to both). Beam search and assisted decoding are not supported.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from torch.utils.checkpoint import checkpoint

if int(transformers.__version__.split(".")[0]) < 5:  # 4.x fails below with a TypeError naming no version
    raise ImportError(f"learntok.hf needs transformers 5 or newer (found {transformers.__version__}): "
                      f"pip install -U 'learntok[hf]'")

from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GenerationMixin,
                          PretrainedConfig, PreTrainedModel, PreTrainedTokenizer)
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast
from transformers.tokenization_utils_base import AddedToken

from . import hub
from .config import from_dict
from .data.batch import BOS, EOS, PAD, VOCAB_SIZE
from .eval.scorer import boundary_uniforms
from .incremental import CachedRows
from .unet import ByteUNet

# transformers 5.24 renamed the generation cache `cache` (`past_key_values` is deprecated there, with a
# warning, and due to go); 5.0-5.23 call it `past_key_values`. The model takes either and hands the cache
# back under the installed transformers' own name.
CACHE = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"

__all__ = ["LearntokCache", "LearntokConfig", "LearntokForCausalLM", "LearntokModel", "LearntokTokenizer"]

# what AutoModel passes along for the Hub and for classes it loads itself: nothing to do for us
_LOADER_KEYS = {"trust_remote_code", "_from_auto", "_from_pipeline", "_commit_hash", "code_revision",
                "adapter_kwargs", "force_download", "proxies", "low_cpu_mem_usage", "attn_implementation",
                "use_safetensors", "resume_download", "user_agent", "gguf_file"}


class _SavesLearntokCode:
    """`save_pretrained` for the config and tokenizer: the directory gets learntok's ``learntok_hf.py`` (which
    imports the installed learntok) and an ``auto_map`` naming it. A class loaded with ``trust_remote_code``
    is registered for its Auto class, and transformers would then copy the source of the module defining it
    (``learntok/hf.py``) and of every module it imports relatively, which it cannot find outside the package
    (FileNotFoundError, also at every checkpoint of a ``Trainer``). The file is written first, so that
    ``push_to_hub=True`` uploads it with the rest."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        hub.write_remote_code(save_directory)
        self._auto_class = None  # this object's own: no copy of learntok's source
        try:
            return super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            del self._auto_class


class LearntokConfig(_SavesLearntokCode, PretrainedConfig):
    """config.json of a learntok directory: learntok's own sections (``model``, ``boundaries``,
    ``train``, ``data``, ``training``) as dicts, and the keys transformers reads. ``boundary_seed``:
    the stream of boundary draws in eval mode (0, as `learntok score`)."""

    model_type = hub.MODEL_TYPE

    def __init__(self, model: dict | None = None, boundaries: dict | None = None, train: dict | None = None,
                 data: dict | None = None, training: dict | None = None, boundary_seed: int = 0,
                 max_position_embeddings: int = hub.FALLBACK_CONTEXT, **kwargs):
        for key, value in (("bos_token_id", BOS), ("eos_token_id", EOS), ("pad_token_id", PAD)):
            kwargs.setdefault(key, value)
        kwargs.pop("vocab_size", None)
        kwargs.setdefault("auto_map", copy.deepcopy(hub.AUTO_MAP))
        super().__init__(**kwargs)
        self.model, self.boundaries, self.train, self.data = model or {}, boundaries or {}, train, data
        self.training = training or {}
        self.boundary_seed = boundary_seed
        self.max_position_embeddings = max_position_embeddings
        self.vocab_size = VOCAB_SIZE

    def run_config(self):
        """learntok's `RunConfig` of these sections."""
        sections = {k: v for k, v in (("model", self.model), ("boundaries", self.boundaries), ("train", self.train),
                                      ("data", self.data)) if v}
        return from_dict(sections, trained=True)


class LearntokCache:
    """What `generate` carries between calls of `forward`: the rows' `incremental.CachedRows` (the U-Net's
    byte-level windows, token level and strategy state, every row stepping in one batch),
    made on the first call, and ``seen``, the columns of ``input_ids`` fed so far."""

    is_compileable = False
    is_linear: tuple[bool, ...] = ()  # no per-layer key/value caches for generate to slice its inputs by

    def __init__(self, max_length: int | None = None):
        self.max_length = max_length  # columns of input_ids generation will reach, when known
        self.rows: CachedRows | None = None
        self.seen = 0
        self.prompts: list[torch.Tensor] = []  # each row's prefilled bytes, BOS first
        self.fed: list[torch.Tensor] = []  # (B,) per byte fed after the prompts: to re-prefill a larger cache

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen


class LearntokPreTrainedModel(PreTrainedModel):
    """What both transformers models of a learntok `ByteUNet` (``self.unet``) share: building, loading and
    saving, gradient checkpointing, and the forward pass over rows as tools give them."""

    config_class = LearntokConfig
    base_model_prefix = "unet"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True

    def __init__(self, config: LearntokConfig, unet: ByteUNet | None = None):
        super().__init__(config)
        if unet is None:  # from_config: the facts of the config go with the model, to be saved again
            run_cfg = config.run_config()
            unet = ByteUNet(run_cfg.model, run_cfg.boundaries)
            unet.info = hub.ModelInfo(run_cfg, dict(config.training), run_known=bool(config.train))
        self.unet = unet
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.unet.embed

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.unet.embed = value

    def resize_token_embeddings(self, *args, **kwargs):
        raise NotImplementedError("learntok: the vocabulary is the 256 bytes and BOS, EOS and PAD; it has no size to "
                                  "change (new symbols are UTF-8 bytes)")

    def _init_weights(self, module) -> None:
        """Nothing: the U-Net initialises itself when built (`ByteUNet.reset_parameters`) or is loaded."""

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=checkpoint,
                                    every_n_layers: int = 1) -> None:
        """transformers' gradient checkpointing (``gradient_checkpointing_enable()``, ``Trainer``'s
        ``gradient_checkpointing=True``): every block of the U-Net's three stacks recomputes its activations in
        the backward pass (`model.layers.Stack.recompute`)."""
        if enable and every_n_layers != 1:
            raise NotImplementedError("learntok: gradient checkpointing recomputes every block (every_n_layers=1)")
        for stack in (self.unet.encoder, self.unet.mid, self.unet.decoder):
            stack.recompute = gradient_checkpointing_func if enable else None
        self.gradient_checkpointing = enable  # what transformers' `is_gradient_checkpointing` reads

    # --- loading and saving: through learntok.hub ------------------------------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *model_args, config=None, dtype=None,
                        torch_dtype=None, device_map=None, revision: str | None = None, token: str | None = None,
                        cache_dir: str | None = None, local_files_only: bool = False, subfolder: str = "", **kwargs):
        """Load with `learntok.from_pretrained` (a saved directory, a training run or a Hub repo), in
        eval mode. ``dtype`` (or ``torch_dtype``; by default ``"auto"``, as in transformers: the type the
        weights were saved in) and ``device_map`` (a device) are honoured. The model's
        sections come from the directory; ``boundary_seed`` from ``config`` when given (AutoModel puts
        keyword arguments such as ``boundary_seed=1`` there) or from the keyword itself."""
        seed = kwargs.pop("boundary_seed", config.boundary_seed if isinstance(config, LearntokConfig) else 0)
        unknown = sorted(k for k, v in kwargs.items() if k not in _LOADER_KEYS and v is not None)
        if model_args or unknown:
            warnings.warn(f"learntok: from_pretrained ignores {[*map(repr, model_args), *unknown]}", stacklevel=2)
        unet = hub.from_pretrained(pretrained_model_name_or_path, revision=revision, token=token, cache_dir=cache_dir,
                                   local_files_only=local_files_only, subfolder=subfolder or "")
        model = cls(LearntokConfig(**hub.config_json(unet), boundary_seed=int(seed)), unet=unet)
        dtype = dtype if dtype is not None else torch_dtype
        if dtype is None or dtype == "auto":  # transformers' default: the type the weights were saved in
            dtype = unet.info.dtype
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model.to(dtype)
        model.config.dtype = dtype
        if device_map is not None:
            if isinstance(device_map, dict):  # {"": device}: the whole model on one device (lm-eval passes this)
                if set(device_map) != {""}:
                    raise ValueError("learntok: device_map must name one device (the model is not split across devices)")
                device_map = device_map[""]
            if device_map == "auto":
                device_map = "cuda" if torch.cuda.is_available() else "cpu"
            model.to(device_map)
        return model.eval()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Also a model.safetensors' state dict, which holds the U-Net's own names (no ``unet.`` prefix): what
        ``Trainer`` reads back from its checkpoints (``resume_from_checkpoint``, ``load_best_model_at_end``)."""
        prefix = self.base_model_prefix + "."
        if state_dict and not any(k.startswith(prefix) for k in state_dict):
            state_dict = {prefix + k: v for k, v in state_dict.items()}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def save_pretrained(self, save_directory: str | Path, *args, **kwargs) -> None:
        """Write the directory with `learntok.save_pretrained` (extra arguments of transformers' own
        save_pretrained, such as ``safe_serialization``, have nothing to change)."""
        hub.save_pretrained(self.unet, save_directory)

    # --- the forward pass ----------------------------------------------------------------------

    def _uniforms(self, rows: int, length: int) -> torch.Tensor | None:
        """The boundary draws of `rows` rows of `length` positions: the eval stream, or None in training
        (the strategy draws its own)."""
        if self.training or not getattr(self.unet.boundaries, "stochastic", False):
            return None
        u = boundary_uniforms(self.config.boundary_seed, length).to(self.device)
        return u.expand(rows, length)

    @staticmethod
    def _real(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask, offset): which columns are real bytes (B, T) bool, and per row 1 when BOS must be put
        in front of its first real column, else 0 (B,)."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        first = input_ids.gather(1, mask.long().argmax(1, keepdim=True))[:, 0]  # each row's first real column
        return mask, (first != BOS).long()

    def _full_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      hidden_states: bool = False) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The logits (B, T, V) at the given positions, and the byte level's states when `hidden_states` (see
        `forward`), else None."""
        B, T = input_ids.shape
        if self.unet.draws > 1:
            raise NotImplementedError("learntok: a model trained with boundaries.group_size > 1 runs in training mode "
                                      "only under `learntok train`; call model.eval()")
        mask, offset = self._real(input_ids, attention_mask)
        # the internal position of every real column: rows start at 0 with BOS, left padding removed
        position = (mask.long().cumsum(1) - 1 + offset[:, None]).clamp(min=0)  # (B, T)
        length = int((mask.sum(1) + offset).max())
        if self.unet.boundaries.length_dependent:  # pad to the trained length (BOS included), as learntok's scorer does
            length = max(length, self.config.max_position_embeddings + 1)
        inputs = torch.full((B, length), PAD, dtype=torch.long, device=input_ids.device)
        inputs[:, 0] = BOS
        rows = torch.arange(B, device=input_ids.device)[:, None].expand(B, T)
        inputs[rows[mask], position[mask]] = input_ids[mask].long()  # int32 ids too (numpy, ONNX exports)
        with self._byte_states(hidden_states) as states:
            out = self.unet(inputs, uniforms=self._uniforms(B, length))
        given = lambda t: t.gather(1, position[..., None].expand(B, T, t.shape[-1])) * mask[..., None]  # noqa: E731
        if not hidden_states:
            return given(out.logits), None
        states[-1] = self.unet.head.norm(states[-1])
        return given(out.logits), tuple(given(state) for state in states)

    @contextlib.contextmanager
    def _byte_states(self, record: bool):
        """A list that collects, while the U-Net runs, the byte level's residual stream: the input of the encoder
        and of the decoder, and the output of each of their blocks, in that order (hooks, removed on exit)."""
        states, hooks = [], []
        if record:
            for stack in (self.unet.encoder, self.unet.decoder):
                hooks.append(stack.register_forward_pre_hook(lambda module, args: states.append(args[0])))
                hooks += [block.register_forward_hook(lambda module, args, output: states.append(output))
                          for block in stack.blocks]
        try:
            yield states
        finally:
            for hook in hooks:
                hook.remove()

    @staticmethod
    def _refuse_attentions(kwargs: dict) -> None:
        if kwargs.get("output_attentions"):
            raise NotImplementedError("learntok: attention weights are not kept (the attention kernels never form "
                                      "them whole); output_hidden_states=True gives the byte level's states")


class LearntokModel(LearntokPreTrainedModel):
    """The U-Net as transformers' base model (``AutoModel``, the ``feature-extraction`` pipeline): the byte
    level's final states (``last_hidden_state``, (B, T, C), zeros at padding) of rows given as to
    `LearntokForCausalLM`, whose ``hidden_states`` (see its ``forward``) it also gives."""

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                **kwargs) -> BaseModelOutput | tuple:
        self._refuse_attentions(kwargs)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        _, states = self._full_forward(input_ids, attention_mask, hidden_states=True)
        out = BaseModelOutput(last_hidden_state=states[-1], hidden_states=states if output_hidden_states else None)
        return out if return_dict is not False else out.to_tuple()


class LearntokForCausalLM(LearntokPreTrainedModel, GenerationMixin):
    """A learntok `ByteUNet` (``self.unet``) as a transformers causal LM (see the module docstring)."""

    def __init__(self, config: LearntokConfig, unet: ByteUNet | None = None):
        super().__init__(config, unet)
        self.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                                                  suppress_tokens=[BOS, PAD])

    # --- forward ---------------------------------------------------------------------------------

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                cache: LearntokCache | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, return_dict: bool | None = None,
                past_key_values: LearntokCache | None = None, logits_to_keep: int = 0,
                output_hidden_states: bool | None = None, **kwargs) -> CausalLMOutputWithPast | tuple:
        """Next-byte logits (B, T, V) at every given position (zeros at padding), or at the last
        ``logits_to_keep`` of them, and with ``labels`` the mean next-byte cross-entropy over positions
        whose label is not -100 (shifted as usual; a byte after padding, a left-padded row's first, is not
        scored, as a row's first byte is not). With a `LearntokCache` (`cache`, or `past_key_values`
        as older transformers name it; ``use_cache=True`` starts one), as with any transformers model:
        the first call feeds the prompts, and every later one only the bytes that follow (B, n), whose
        logits it returns.

        ``output_hidden_states=True`` (without a cache) adds ``hidden_states``: the byte level's residual
        stream, each (B, T, C) at every given position (zeros at padding): the scaled embeddings, the output
        of each encoder block, the decoder's input (the encoder output plus the token level's output of the
        token each byte is in), the output of each decoder block, the last with the head's final norm (as
        transformers' decoders give it). The token level's states are per token; ``model.unet`` has them."""
        self._refuse_attentions(kwargs)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"learntok: input_ids must be (batch, length) with at least one position, got shape "
                             f"{tuple(input_ids.shape)}")
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache and not self.training:
            cache = LearntokCache()
        output_hidden_states = output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        states = None
        if cache is not None:
            if output_hidden_states:
                raise NotImplementedError("learntok: hidden states come from a forward pass without a cache "
                                          "(use_cache=False)")
            logits = self._generation_step(input_ids, attention_mask, cache, logits_to_keep)
        else:
            logits, states = self._full_forward(input_ids, attention_mask, output_hidden_states)
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            if logits.shape[1] != labels.shape[1]:
                raise ValueError(f"learntok: labels cover {labels.shape[1]} positions but logits {logits.shape[1]} "
                                 f"(logits_to_keep={logits_to_keep}, or a cache's later call): give labels for the "
                                 f"positions whose logits are returned")
            targets = labels[:, 1:]
            if attention_mask is not None:
                # a byte after padding (a left-padded row's first) is not scored, as a row's first byte alone is
                # not: the padding column before it holds no prediction
                predicted_from = attention_mask[:, -labels.shape[1]:-1].bool()
                targets = targets.masked_fill(~predicted_from, -100)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                   ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=states, **{CACHE: cache})
        return out if return_dict is not False else out.to_tuple()

    def _generation_step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                         cache: LearntokCache, logits_to_keep: int) -> torch.Tensor:
        """Feed `input_ids` to the cache: the prompts on its first call, the bytes that follow on later
        ones. Returns the logits at the last `logits_to_keep` columns given (0: all), (B, n, V)."""
        if self.unet.draws > 1:
            raise NotImplementedError("learntok: generation runs in eval mode; call model.eval()")
        if cache.rows is None:
            mask, offset = self._real(input_ids, attention_mask)
            rows = [torch.cat([input_ids.new_tensor([BOS] * int(o)), ids[m]]) for ids, m, o in zip(input_ids, mask, offset)]
            # room for the bytes to come, as learntok generate allocates it (`uniform` spreads its pattern over it)
            new = cache.max_length - input_ids.shape[1] if cache.max_length else self.config.max_position_embeddings
            uniforms = boundary_uniforms(self.config.boundary_seed, max(len(r) for r in rows) + new)
            cache.rows = CachedRows(self.unet, rows, new, uniforms.to(input_ids.device))
            cache.prompts = rows
            last = cache.rows.logits[:, None].clone()  # (B, 1, V)
            if logits_to_keep != 1 and input_ids.shape[1] > 1:  # the prompts' own logits too: a full forward
                logits = self._full_forward(input_ids, attention_mask)[0][:, -logits_to_keep:]
                logits[:, -1:] = last  # the cache's, which the bytes that follow are drawn from
                last = logits
        else:
            n, steps = input_ids.shape[1], []
            for column in range(n):
                self._make_room(cache)
                logits = cache.rows.append(input_ids[:, column])
                cache.fed.append(input_ids[:, column])
                if logits_to_keep == 0 or column >= n - logits_to_keep:
                    steps.append(logits.clone())
            last = torch.stack(steps, 1)
        cache.seen += input_ids.shape[1]
        return last

    def _make_room(self, cache: LearntokCache) -> None:
        """A cache full (a hand-written loop past the room it was made with, or a later `generate` from a
        returned cache) is prefilled again, larger, from every row's bytes so far: the position-indexed
        draws give the same boundaries (a length-dependent strategy, `uniform`, spreads its pattern anew)."""
        inner = cache.rows.cache
        if inner.position < inner.max_len:
            return
        fed = torch.stack(cache.fed, 1) if cache.fed else cache.prompts[0].new_zeros(len(cache.prompts), 0)
        rows = [torch.cat([prompt, fed[b]]) for b, prompt in enumerate(cache.prompts)]
        new = max(max(len(r) for r in rows), self.config.max_position_embeddings)  # doubling: amortised O(1)
        uniforms = boundary_uniforms(self.config.boundary_seed, max(len(r) for r in rows) + new)
        cache.rows = CachedRows(self.unet, rows, new, uniforms.to(fed.device))

    # --- generate's hooks ------------------------------------------------------------------------

    def generate(self, *args, assistant_model=None, **kwargs):
        """transformers' `generate`, greedy or sampling (see the module docstring)."""
        if assistant_model is not None:  # it would rewind the cache, which the U-Net's levels cannot
            raise NotImplementedError("learntok: assisted decoding is not supported; use greedy or sampling")
        return super().generate(*args, **kwargs)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """A `LearntokCache` with room for `generation_config.max_length` columns (not transformers' own
        key/value caches: the U-Net's levels and its strategy keep their own state)."""
        if generation_config.num_beams > 1:
            raise NotImplementedError("learntok: beam search is not supported; use greedy or sampling")
        if model_kwargs.get(CACHE) is None and generation_config.use_cache is not False:
            model_kwargs[CACHE] = LearntokCache(generation_config.max_length)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, cache: LearntokCache | None = None,
                                      attention_mask: torch.Tensor | None = None, use_cache: bool | None = None,
                                      past_key_values: LearntokCache | None = None, logits_to_keep: int | None = None,
                                      **kwargs) -> dict:
        """The columns the cache has not seen (all of them without a cache: a full forward)."""
        cache = cache if cache is not None else past_key_values
        inputs = {"input_ids": input_ids[:, cache.seen:] if cache is not None else input_ids,
                  "attention_mask": attention_mask, CACHE: cache, "use_cache": use_cache}
        return inputs if logits_to_keep is None else inputs | {"logits_to_keep": logits_to_keep}


class LearntokTokenizer(_SavesLearntokCode, PreTrainedTokenizer):
    """UTF-8 bytes as ids 0-255 and learntok's BOS (256), EOS (257) and PAD (258). Encoding adds no
    special ids (the model puts BOS in front of a row that lacks it, so a text scores the same with or
    without one, and tools that add their own prefix token, such as lm-eval's rolling windows, get no
    second BOS); the names of the special tokens in a text are its bytes. Decoding turns an incomplete
    UTF-8 sequence into U+FFFD."""

    vocab_files_names: dict = {}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", **kwargs):
        specials = {BOS: bos_token, EOS: eos_token, PAD: pad_token}
        self._added_tokens_decoder = {i: AddedToken(t, special=True) if isinstance(t, str) else t
                                      for i, t in specials.items()}
        kwargs.setdefault("split_special_tokens", True)  # "<eos>" in a text is five bytes
        kwargs.setdefault("padding_side", "left")  # for generation
        super().__init__(bos_token=bos_token, eos_token=eos_token, pad_token=pad_token, **kwargs)
        self._auto_map = {"AutoTokenizer": list(hub.AUTO_MAP["AutoTokenizer"])}  # saved in tokenizer_config.json

    @property
    def vocab_size(self) -> int:
        return 256

    def get_vocab(self) -> dict[str, int]:
        return {**{chr(i): i for i in range(256)}, **self.added_tokens_encoder}

    # A byte's token is the character of its value (U+0000-U+00FF), so a text's tokens are its UTF-8 bytes read
    # as Latin-1, and the conversions below run whole texts through `bytes` at once where transformers would
    # convert token by token (ten times slower); a list holding anything else (a special token) goes token by token.

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(text.encode("utf-8").decode("latin-1"))

    def _convert_token_to_id(self, token: str) -> int:
        if len(token) != 1 or ord(token) > 255:
            raise ValueError(f"learntok: {token!r} is not a byte token")
        return ord(token)

    def _convert_id_to_token(self, index: int) -> str:
        if not 0 <= index < 256:  # (the special tokens' ids never reach here)
            hint = " (-100 marks the positions a loss ignores: leave them out)" if index == -100 else ""
            raise ValueError(f"learntok: id {index} is neither a byte (0-255) nor a special token{hint}")
        return chr(index)

    def _encode_plus(self, *args, return_offsets_mapping: bool = False, **kwargs):
        if return_offsets_mapping:  # transformers' Python tokenizers would leave it out without a word
            raise NotImplementedError(
                "learntok's tokenizer has no offsets mapping: token i is byte i of the text's UTF-8 encoding, so a "
                "character's tokens are the bytes of its encoding (len(text[:k].encode()) is where character k starts)")
        return super()._encode_plus(*args, **kwargs)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        data = _latin1(tokens) if not isinstance(tokens, str) else None
        return list(data) if data is not None else super().convert_tokens_to_ids(tokens)

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> str | list[str]:
        ids = ids.tolist() if hasattr(ids, "tolist") else ids  # a tensor or array: its ints at once
        if isinstance(ids, int):  # one id (a 0-d tensor or array too)
            return super().convert_ids_to_tokens(ids, skip_special_tokens)
        ids = list(ids)
        if skip_special_tokens:
            special = set(self.all_special_ids)
            ids = [i for i in ids if i not in special]
        try:
            return list(bytes(ids).decode("latin-1"))
        except (ValueError, TypeError):  # an id of a special or added token
            return super().convert_ids_to_tokens(ids)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = _latin1(tokens)
        if data is None:
            data = b"".join(bytes([ord(t)]) if len(t) == 1 and ord(t) < 256 else t.encode("utf-8") for t in tokens)
        return data.decode("utf-8", errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1: list[int] | None = None) -> list[int]:
        return token_ids_0 + (token_ids_1 or [])  # no special ids (see the class docstring)

    def get_special_tokens_mask(self, token_ids_0: list[int], token_ids_1: list[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        ids = token_ids_0 + (token_ids_1 or [])
        return [int(i in (BOS, EOS, PAD)) for i in ids] if already_has_special_tokens else [0] * len(ids)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        return ()  # the vocabulary is the 256 bytes: nothing to write


def _latin1(tokens: list[str]) -> bytes | None:
    """The bytes of a list of byte tokens; None if it holds any other token."""
    joined = "".join(tokens)
    if len(joined) != len(tokens):
        return None
    try:
        return joined.encode("latin-1")
    except UnicodeEncodeError:
        return None


AutoConfig.register(hub.MODEL_TYPE, LearntokConfig, exist_ok=True)
AutoModel.register(LearntokConfig, LearntokModel, exist_ok=True)
AutoModelForCausalLM.register(LearntokConfig, LearntokForCausalLM, exist_ok=True)
AutoTokenizer.register(LearntokConfig, tokenizer_class=LearntokTokenizer, exist_ok=True)
