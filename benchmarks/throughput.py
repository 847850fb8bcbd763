"""Training-step throughput of the learned policy against fixed boundaries, side by side in one run.

    python benchmarks/throughput.py                          # CPU default config
    python benchmarks/throughput.py --config paper_147m_fineweb --device cuda --steps 20 --bf16

Prints a table (it asserts nothing): step time, bytes/s, tokens/s, token-attention padding, model FLOPs
utilisation (paper §4.2 accounting against --peak-tflops, default 989 bf16 dense for an H100 SXM on
CUDA, none on CPU), peak memory, the operations a step dispatches from Python outside compiled graphs
(host ops: on a GPU about one kernel launch each), and the learned/fixed step-time ratio.
`--dense-baseline` adds the same model with plain dense-mask attention (the "plain eager implementation"
to compare against).
`--group-sizes 2,4` adds the learned policy with K boundary draws per sequence (`boundaries.group_size`,
the same batch of sequences) and prints each one's cost per byte of text relative to K = 1. `--scoring`
adds held-out scoring of the same batch (eval mode, forward only) and its bytes/s relative to training.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learntok.config import load_config  # noqa: E402
from learntok.data.batch import BOS, Batch  # noqa: E402
from learntok.eval.nll import score_rows  # noqa: E402
from learntok.model import layers  # noqa: E402
from learntok.unet import ByteUNet  # noqa: E402
from learntok.train.accumulate import accumulate_gradients  # noqa: E402


def dense_sliding_window(q, k, v, window, cap):
    """Reference: the full T x T score matrix with a band mask (all N^2 work)."""
    T = q.shape[2]
    i = torch.arange(T, device=q.device)
    mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    return layers._attend(q, k, v, mask, cap)


def synthetic_batch(batch_size: int, seq_len: int, seed: int = 0) -> Batch:
    """English-like bytes (letters with spaces) so that learned boundaries are not degenerate."""
    g = torch.Generator().manual_seed(seed)
    letters = torch.randint(97, 123, (batch_size, seq_len + 1), generator=g)
    spaces = torch.rand(batch_size, seq_len + 1, generator=g) < 0.18
    seq = torch.where(spaces, torch.full_like(letters, 32), letters)
    seq[:, 0] = BOS
    return Batch.from_sequences(seq)


class Run:
    """One model training on one fixed batch; `step()` times one optimizer step (the trainer's AdamW)."""

    def __init__(self, cfg, device, bf16: bool, compile_model: bool, sliding_window=None, compile_backend="inductor"):
        torch.manual_seed(0)
        self.sliding_window = sliding_window  # replaces layers.sliding_window_attention during this run's steps
        self.device, self.bf16 = device, bf16
        self.model = ByteUNet(cfg.model, cfg.boundaries).to(device)
        if compile_model:  # as the trainer does (train.compile)
            self.model.compile_layers(backend=compile_backend)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=True)
        self.batch = synthetic_batch(cfg.train.batch_size, cfg.train.seq_len).to(device)
        self.micro_batches, self.recompute_encoder = cfg.train.micro_batches, cfg.train.recompute_encoder
        self.gen = torch.Generator(device=device).manual_seed(0)
        self.times, self.tokens, self.slots = [], 0, 0

    def step(self, timed: bool) -> None:
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        metrics = self.work()
        sync()
        if timed:
            self.times.append(time.perf_counter() - start)
            self.tokens += int(metrics["tokens"])
            self.slots += int(metrics["token_slots"])

    def work(self) -> dict:
        """One optimizer step; returns the loss's metrics."""
        blocked = layers.sliding_window_attention
        if self.sliding_window is not None:
            layers.sliding_window_attention = self.sliding_window
        try:
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                metrics = accumulate_gradients(self.model, self.batch, self.micro_batches, generator=self.gen,
                                               recompute_encoder=self.recompute_encoder)  # as the trainer
        finally:
            layers.sliding_window_attention = blocked
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return metrics

    def result(self) -> dict:
        steps = len(self.times)
        step_time = statistics.median(self.times)
        n_bytes = self.batch.inputs.numel()
        flops = self.model.flops(n_bytes, self.tokens // steps, self.model.draws)
        return {"step_s": step_time, "bytes_s": n_bytes / step_time, "tokens_s": self.tokens / steps / step_time,
                "padding": 1 - self.tokens / max(self.slots, 1), "flops_s": flops / step_time}


class ScoringRun(Run):
    """The same model scoring the batch as held-out evaluation does (`learntok.eval.nll.score_rows`): eval
    mode, boundaries sampled, forward only; FLOPs counted as a third of a training step's (forward only)."""

    def work(self) -> dict:
        self.model.eval()
        b = self.batch
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            res = score_rows(self.model, b.inputs, b.targets, b.valid, doc_start=b.doc_start, generator=self.gen)
        return {"tokens": res.tokens, "token_slots": res.token_slots}

    def result(self) -> dict:
        out = super().result()
        out["flops_s"] /= 3
        return out


def host_operations(run: Run) -> int:
    """The PyTorch operations one training step dispatches from Python outside compiled graphs (forward and
    backward; calls made inside another operation not counted again). On a GPU nearly each launches a kernel,
    at several microseconds of host time apiece, so where the host is slower than the GPU they set the pace."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run.step(timed=False)

    def counted(e) -> bool:
        if not e.name.startswith("aten::"):
            return False
        parent = e.cpu_parent
        if parent is not None and parent.name.startswith("aten::"):
            return False
        while parent is not None:  # "Torch-Compiled Region", CompiledFunction and its backward
            if "Compiled" in parent.name:
                return False
            parent = parent.cpu_parent
        return True
    return sum(counted(e) for e in prof.events())


def measure(runs: list[Run], steps: int, warmup: int) -> list[dict]:
    """Interleaved: one step of each run in turn, so that a change in the machine's speed (another
    process, clock scaling) hits every run alike. Peak memory: per run on CUDA, its own (its weights, and
    what its warm-up steps allocated at most: gradients, optimizer state, activations; not the other
    runs' weights, which share the device); on a CPU the process's peak resident size, shared by all runs."""
    results = []
    for r in runs:
        if r.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        for _ in range(warmup):
            r.step(timed=False)
        weights = sum(p.numel() * p.element_size() for p in r.model.parameters())
        r.peak = torch.cuda.max_memory_allocated() - before + weights if r.device.type == "cuda" else None
    for _ in range(steps):
        for r in runs:
            r.step(timed=True)
    # on a CPU the peak is the process's, shared by the rows: read once, before the profiled steps below
    process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for r in runs:
        out = r.result()
        out["peak_gib"] = (r.peak if r.peak is not None else process_peak) / 2**30
        out["host_ops"] = host_operations(r)
        results.append(out)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="cpu_default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU; on CPU it is ~10x slower)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: 989 on cuda)")
    p.add_argument("--fixed", default="uniform", help="the fixed-boundary strategy to compare against")
    p.add_argument("--dense-baseline", action="store_true", help="also time dense-mask attention")
    p.add_argument("--group-sizes", default="", help="comma-separated K: also time the learned policy with K draws")
    p.add_argument("--scoring", action="store_true",
                   help="also time held-out scoring of the same batch (eval mode, forward only)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    device = torch.device(args.device)
    peak = args.peak_tflops or (989.0 if device.type == "cuda" else None)

    names = ["learned", args.fixed]
    runs = [Run(load_config(args.config, args.overrides + [f"boundaries.name={n}"]), device, args.bf16, args.compile)
            for n in names]
    if args.dense_baseline:  # the same learned model with the sliding window as one dense masked matrix
        names.append("learned, dense-mask attention")
        # blocked attention: the kernel whose sliding window this replaces (flex would run FlexAttention instead)
        runs.append(Run(load_config(args.config, args.overrides + ["boundaries.name=learned", "model.attention=blocked"]),
                        device, args.bf16, False, sliding_window=dense_sliding_window))
    if args.scoring:
        names.append("learned, held-out scoring (forward only)")
        runs.append(ScoringRun(load_config(args.config, args.overrides + ["boundaries.name=learned"]), device,
                               args.bf16, args.compile))
    groups = [int(k) for k in args.group_sizes.split(",") if k.strip()]
    for k in groups:
        names.append(f"learned, {k} draws per sequence")
        runs.append(Run(load_config(args.config, args.overrides + ["boundaries.name=learned", f"boundaries.group_size={k}",
                                                                  "boundaries.learned.batch_centering=group_loo"]),
                        device, args.bf16, args.compile))
    rows = list(zip(names, measure(runs, args.steps, args.warmup)))

    cfg = load_config(args.config, args.overrides)
    print(f"config {args.config} {' '.join(args.overrides)}: batch {cfg.train.batch_size} x {cfg.train.seq_len} bytes, "
          f"device {device}{' bf16' if args.bf16 else ' fp32'}{' compiled' if args.compile else ''}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| strategy | step (ms) | bytes/s | tokens/s | token padding | TFLOP/s | MFU | peak mem (GiB) | host ops |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        mfu = f"{r['flops_s'] / 1e12 / peak:.1%}" if peak else "n/a"
        print(f"| {name} | {r['step_s'] * 1e3:.1f} | {r['bytes_s']:,.0f} | {r['tokens_s']:,.0f} | {r['padding']:.3f} | "
              f"{r['flops_s'] / 1e12:.3f} | {mfu} | {r['peak_gib']:.2f} | {r['host_ops']} |")
    learned, fixed = rows[0][1], rows[1][1]
    print(f"\n(median of {args.steps} steps per row after {args.warmup} warm-up steps; the rows' steps interleaved)")
    print(f"\nlearned / {args.fixed} step time: {learned['step_s'] / fixed['step_s']:.3f}")
    if args.dense_baseline:
        print(f"blocked / dense-mask bytes/s: {learned['bytes_s'] / rows[2][1]['bytes_s']:.2f}x")
    if args.scoring:
        scoring = next(r for name, r in rows if name.startswith("learned, held-out scoring"))
        print(f"held-out scoring / training step bytes/s: {scoring['bytes_s'] / learned['bytes_s']:.2f}x")
    for k, (name, r) in zip(groups, rows[len(rows) - len(groups):]):
        print(f"K = {k}: time per byte of text {learned['bytes_s'] / r['bytes_s']:.2f}x K = 1's "
              f"(FLOPs per byte {r['flops_s'] / r['bytes_s'] / (learned['flops_s'] / learned['bytes_s']):.2f}x)")


if __name__ == "__main__":
    main()
