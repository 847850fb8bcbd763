"""Data parallelism, applied from outside the model (STYLE.md: torchtitan's `parallelize`).

Launch with torchrun (`torchrun --nproc-per-node N -m learntok.cli train ... train.parallel=ddp|fsdp`);
the process group comes from its environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), backend
nccl on CUDA and gloo on CPU. What is split and what is shared:

- data: the global batch of `train.batch_size` sequences is split into contiguous blocks of rows, rank r
  taking block r (the loaders' `rank`/`world_size`); the boundary uniforms are drawn for the whole global
  batch on every rank from the shared generator and each rank takes its rows, so every row samples what
  it samples in a single-process run;
- losses: every term is a sum over this rank's rows divided by a count over the global batch, and the
  learned policy's batch statistics (sums) are all-reduced before its losses, so the advantage baseline is
  the mean over the whole global batch (all ranks, all micro-batches), and the gradients are SUMmed;
- `ddp`: replicated weights; after the step's backward passes, one bucketed all-reduce (SUM) of the
  gradients. torch's DistributedDataParallel wrapper is not used: its reducer expects one `forward` and one
  backward per step, and the two-phase accumulation (train/accumulate.py) runs several backward passes
  through `encode`, the downstream and the policy's losses;
- `fsdp`: FSDP2 `fully_shard` on every transformer block, then on the whole model; gradients are
  reduce-scattered with a divide factor of 1 (a SUM, as above), the optimizer holds the shards;
- clipping: the norm of the global gradient (FSDP: sum of the shards' squared norms, all-reduced);
- checkpoints: full (unsharded) state dicts written by rank 0 in the single-process format, so a run can
  resume on any number of ranks, 1 included.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from ..boundaries import Boundaries
from ..unet import UNetOutput

BUCKET_BYTES = 25 * 2**20  # gradient all-reduce bucket, as DDP's default


@dataclass
class DistInfo:
    """This process's place among the ranks (one process, no group: rank 0 of 1, `parallel` none)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    parallel: str = "none"

    @property
    def enabled(self) -> bool:
        """In a process group (of one or more ranks): collectives run."""
        return self.parallel != "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """SUM over ranks, in place (nothing to do without a group)."""
        if self.enabled:
            dist.all_reduce(t)
        return t

    def sum_dict(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sum each tensor over ranks with one all-reduce (same keys and shapes on every rank)."""
        if not self.enabled or not values:
            return values
        keys = sorted(values)
        flat = torch.cat([values[k].detach().float().reshape(-1) for k in keys])
        dist.all_reduce(flat)
        out, at = {}, 0
        for k in keys:
            n = values[k].numel()
            out[k] = flat[at: at + n].view(values[k].shape).to(values[k].dtype)
            at += n
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def resolve_device(name: str) -> torch.device:
    """``auto`` (the GPU when there is one, else the CPU) or a device torch names, checked here: a name torch
    does not know, or a GPU this machine does not have, is a ValueError that says so (torch would fail later,
    with an assertion about how it was built)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device {name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: this PyTorch sees no CUDA GPU on this machine; use cpu (or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return device


def init_distributed(device: str = "auto", parallel: str = "none") -> tuple[DistInfo, torch.device]:
    """Join the process group torchrun describes in the environment (once per process) and pick this
    rank's device (cuda:LOCAL_RANK on a GPU machine). One torchrun process with `parallel` ddp or fsdp
    joins a group of one, so that FSDP2 shards (into one piece) as it would on many; without torchrun:
    rank 0 of 1, no group, `parallel` none."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    launched = all(key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    if world > 1 and parallel == "none":
        raise ValueError(f"started as {world} processes (torchrun) with train.parallel=none: choose train.parallel=ddp "
                         f"or fsdp, or start one process")
    if parallel != "none" and not launched:
        warnings.warn(f"train.parallel={parallel} in a process torchrun did not start: it trains alone, in no "
                      f"process group (start it with torchrun to replicate or shard)", stacklevel=2)
    grouped = world > 1 or (launched and parallel != "none")
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local if grouped else torch.cuda.current_device())
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if grouped and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None)
    return DistInfo(rank, world, local, parallel if grouped else "none"), dev


def parallelize(model: nn.Module, cfg, info: DistInfo) -> nn.Module:
    """Apply `cfg.train.parallel` to a built model, in place, and return it. `ddp`: weights replicated (made
    identical by a broadcast from rank 0); gradients are all-reduced by `sync_gradients`. `fsdp`: FSDP2 on
    each transformer block, then the root (torchtitan's order). The model file knows nothing of this."""
    if not info.enabled:
        return model
    if info.parallel == "ddp":
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)
        return model
    if info.parallel == "fsdp":
        if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 12):
            _register_outputs_as_pytrees()  # newer FSDP2 looks inside dataclasses itself
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
        for stack in (model.encoder, model.mid, model.decoder):
            for block in _blocks(stack):
                fully_shard(block)
        fully_shard(model)
        for m in model.modules():  # SUM, not the default mean: each rank's loss is already / global count
            if hasattr(m, "set_gradient_divide_factor"):
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
        register_fsdp_forward_method(model, "encode")  # an entry point besides forward: it gathers the weights too
        return model
    raise ValueError(f"train.parallel={info.parallel!r}: use none, ddp or fsdp")


def _register_outputs_as_pytrees() -> None:
    """Make the dataclasses ByteUNet returns (`UNetOutput`, every strategy's `Boundaries`) pytree nodes.
    FSDP2 before torch 2.12 hooks a module's backward onto the output tensors that torch's pytree finds, which
    does not look inside a dataclass: the root's weights were then not gathered again for the backward
    ("setStorage: ... storage of size 0", 2 ranks, torch 2.10 and 2.11)."""
    classes, todo = [], [UNetOutput, Boundaries]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    for cls in classes:
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_dataclass(cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")


def _blocks(stack: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformer stack (its first ModuleList), else the stack itself."""
    for child in stack.children():
        if isinstance(child, nn.ModuleList):
            return list(child)
    return [stack]


def sync_gradients(model: nn.Module, info: DistInfo) -> None:
    """DDP's gradient all-reduce (SUM), once per optimizer step, in buckets of about 25 MiB."""
    if not info.enabled or info.parallel != "ddp":
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads + [None]:
        if g is not None:
            bucket.append(g)
            size += g.numel() * g.element_size()
        if bucket and (g is None or size >= BUCKET_BYTES):
            flat = torch.cat([b.reshape(-1) for b in bucket])
            dist.all_reduce(flat)
            pieces = flat.split([b.numel() for b in bucket])
            torch._foreach_copy_(bucket, [piece.view_as(b) for piece, b in zip(pieces, bucket)])
            bucket, size = [], 0


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _local_grads(model: nn.Module) -> list[torch.Tensor]:
    """The gradients this rank holds (FSDP: its shards, as plain tensors: no DTensor dispatch per operation)."""
    return [_local(p.grad) for p in model.parameters() if p.grad is not None]


# Both below are a few fused (foreach) operations over all the gradients, not one or more per parameter: on
# a GPU each operation is a kernel launched from the host, and the 147M model has 166 parameters.
def local_grad_sq(model: nn.Module) -> torch.Tensor:
    """Sum of squared gradient entries held by this rank (FSDP: its shards), fp32, on the device."""
    grads = _local_grads(model)
    if not grads:
        return torch.zeros(())
    return torch.stack(torch._foreach_norm(grads)).float().square().sum()


def clip_with_norm_(model: nn.Module, max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale the gradients by min(1, max_norm / total_norm), on device, without a host sync."""
    grads = _local_grads(model)
    if not math.isfinite(max_norm) or not grads:
        return
    torch._foreach_mul_(grads, (max_norm / (total_norm + 1e-6)).clamp(max=1.0).to(grads[0].device))


# --- full state dicts for checkpoints --------------------------------------------------------------

def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """The unsharded weights (a collective under FSDP: every rank calls it; rank 0 gets them)."""
    if info.parallel != "fsdp":
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(model, options=_full_options())


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> dict:
    """`optimizer.state_dict()` of the unsharded model, parameters numbered as in `model.parameters()`
    (the single-process checkpoint format). A collective under FSDP."""
    if info.parallel != "fsdp":
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    sd = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if not sd:  # ranks other than 0 receive nothing (cpu_offload with full_state_dict)
        return {}
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]]
    return {"state": {index[n]: s for n, s in sd["state"].items()}, "param_groups": groups}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                    optim_state: dict, info: DistInfo) -> None:
    """Load a full (unsharded) checkpoint into this rank's model and optimizer (sharding them under FSDP)."""
    if info.parallel != "fsdp":
        model.load_state_dict(weights)
        optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    names = [name for name, _ in model.named_parameters()]
    fqn = {"state": {names[int(i)]: s for i, s in optim_state["state"].items()},
           "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in optim_state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, fqn, options=options)
