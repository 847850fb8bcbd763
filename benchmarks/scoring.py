"""Scoring speed beside a training step of the same model, per thread count and rows per forward pass.

    python benchmarks/scoring.py --checkpoint runs/demo --batch-sizes 1,16 --thread-counts 1,2

Scoring is what `learntok eval` and `learntok score` do with held-out documents: each document from its
own BOS, in windows of the trained length that overlap by half (`eval.scorer.UNetScorer`, whose forward
is `eval.nll.score_rows`, the pass behind every bits-per-byte). Two rates per batch size: bytes the model
ran over (computed; the overlap makes it about twice the scored bytes) and bytes scored. The training
step is forward, backward and AdamW on the run's batch shape, as `benchmarks/throughput.py` times it,
measured in the same process just before. The documents are the demo corpus's held-out stream cut into
pieces of `--doc-bytes`. `--compile` adds the same scoring with the model's layers compiled
(`UNetScorer(compile=True)`, `learntok eval --compile`), compiled afresh for each thread count; the
compile time is printed apart.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py

import torch  # noqa: E402

from learntok.config import load_config  # noqa: E402
from learntok.data.demo import build_demo_corpus  # noqa: E402
from learntok.eval.scorer import UNetScorer, split_windows  # noqa: E402
from learntok.hub import from_pretrained  # noqa: E402
from learntok.unet import ByteUNet  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="a trained model (run, checkpoint or save_pretrained directory); "
                                        "default: random weights at the CPU default size")
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated rows per forward pass (default 1,16)")
    p.add_argument("--thread-counts", default="1,2", help="comma-separated torch thread counts (default 1,2)")
    p.add_argument("--doc-bytes", type=int, default=4096, help="bytes per held-out document (default 4096)")
    p.add_argument("--total-bytes", type=int, default=1 << 16, help="held-out bytes scored per run (default 64 KiB)")
    p.add_argument("--compile", action="store_true", help="also score with the layers compiled")
    args = p.parse_args()

    from throughput import Run, measure

    if args.checkpoint:
        model = from_pretrained(args.checkpoint)
        what, cfg = args.checkpoint, model.info.config
    else:
        cfg = load_config("cpu_default")
        torch.manual_seed(0)
        model, what = ByteUNet(cfg.model, cfg.boundaries), "random weights"
    model.eval()
    stream = build_demo_corpus(cfg.data.val_fraction).val[:args.total_bytes]
    docs = [bytes(stream[i:i + args.doc_bytes]) for i in range(0, len(stream), args.doc_bytes)]
    max_len = cfg.train.seq_len
    computed = sum(len(c) + len(s) for d in docs for c, s in split_windows(b"", d, max_len, max_len // 2))
    scored = sum(len(d) for d in docs)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(f"model: {what}; {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"{model.boundaries.name} boundaries; {len(docs)} held-out documents, {scored:,} bytes scored, "
          f"{computed:,} computed (windows of {max_len} overlapping by {max_len // 2}); training step: "
          f"{cfg.train.batch_size} x {cfg.train.seq_len} bytes")
    compiled_model = copy.deepcopy(model) if args.compile else None
    if compiled_model is not None:
        compiled_model.compile_layers(dynamic=True)  # as UNetScorer(compile=True) does
    columns = [(b, False) for b in sizes] + [(b, True) for b in sizes if compiled_model is not None]
    print(f"{'threads':>7} {'train step bytes/s':>19}" + "".join(
        f" {'B=%d%s computed/s' % (b, ' compiled' if c else ''):>26} {'scored/s':>9} {'/ train':>8}" for b, c in columns)
        + (f" {'compile s':>9}" if compiled_model is not None else ""))
    for threads in (int(t) for t in args.thread_counts.split(",")):
        torch.set_num_threads(threads)
        torch._dynamo.reset()  # the compiled kernels are generated for a thread count
        (train,) = measure([Run(cfg, torch.device("cpu"), bf16=False, compile_model=False)], steps=5, warmup=2)
        row = f"{threads:>7} {train['bytes_s']:>19.0f}"
        compile_seconds = 0.0
        for b, compiled in columns:
            scorer = UNetScorer(compiled_model if compiled else model, max_len=max_len, batch_size=b)
            t0 = time.perf_counter()
            # warm up (and compile) on every row length the timed pass meets
            scorer.score([(b"", d[:max_len]) for d in docs[:2]] + [(b"", docs[0][:max_len // 2 + 1])])
            compile_seconds += time.perf_counter() - t0 if compiled else 0.0
            t0 = time.perf_counter()
            scorer.score([(b"", d) for d in docs])
            seconds = time.perf_counter() - t0
            row += f" {computed / seconds:>26.0f} {scored / seconds:>9.0f} {computed / seconds / train['bytes_s']:>8.2f}"
        if compiled_model is not None:
            row += f" {compile_seconds:>9.0f}"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
