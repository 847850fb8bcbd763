"""Generation speed with and without key/value caches, and beside a training step.

    python benchmarks/generate.py                       # CPU default size (d=128, 2/2/2), random weights
    python benchmarks/generate.py --checkpoint runs/demo --bytes 1000
    python benchmarks/generate.py --checkpoint runs/demo --batch-sizes 1,16 --thread-counts 1,2 --compile

`--batch-sizes` prints, for each torch thread count, cached generation's bytes/s at each batch size
(B prompts of one length, generated as one batch: the aggregate over the rows) beside the bytes/s of a
training step of the same model (forward, backward and AdamW on the run's batch shape, as
`benchmarks/throughput.py` times it), measured in the same process one after the other. With `--mixed`
the B prompts have B different lengths (the prompt, then one byte longer each): prefilled length by
length, then stepped as one batch, each row at its own position.

`--requests N` times greedy decoding as lm-evaluation-harness's `generate_until` asks for it: N requests
(contexts of 20 to 80 words, up to `--bytes` bytes each, stop string a blank line) through
`UNetScorer.greedy_batch` (the caches, `--batch-size` requests stepping together) against a full forward
pass per byte and request over the context and the bytes so far (what the adapter did before), checking
that both give the same bytes.

Three ways to produce the same bytes (same seed, same boundary draws; the script checks they agree):
  cached          prefill the prompt, then one `ByteUNet.step` per byte: O(window + tokens) per byte
                  (with --compile also through the compiled step, `generate(compile=True)`)
  full, prefix    a full forward pass over the whole prefix per byte (exact for `learned`, whose
                  boundaries look only backwards)
  full, padded    a full forward pass over the prefix padded to the final length per byte (exact for
                  every strategy, also those whose boundaries depend on the length, like `uniform`)
End-of-sequence is disabled so that every run produces exactly --bytes bytes. The cached row runs first:
on a 2-core machine the OpenMP threads of numba's parallel boundary scan (used by every full forward
pass of `learned`) keep spinning after it returns and slow all later torch work several times over;
`NUMBA_THREADING_LAYER=workqueue` or `OMP_WAIT_POLICY=passive` avoids that.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py, for --batch-sizes

import torch  # noqa: E402

from learntok.config import load_config  # noqa: E402
from learntok.generation import generate  # noqa: E402
from learntok.hub import from_pretrained  # noqa: E402
from learntok.unet import ByteUNet  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="a trained model (run, checkpoint or save_pretrained directory); "
                                        "default: random weights at the CPU default size")
    p.add_argument("--bytes", type=int, default=1000, help="bytes to generate (default 1000)")
    p.add_argument("--uncached-bytes", type=int, default=None,
                   help="bytes for the uncached runs (default: --bytes; they are slow)")
    p.add_argument("--prompt", default="The ")
    p.add_argument("--strategy", default=None, help="boundary strategy of the random model (default: cpu_default's)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for every mode (default 1, what `generate` uses for cached CPU generation; "
                        "0: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-padded", action="store_true", help="leave out the slowest row")
    p.add_argument("--batch-sizes", default="", help="comma-separated: the side-by-side table instead (see above)")
    p.add_argument("--thread-counts", default="1", help="comma-separated torch thread counts for --batch-sizes")
    p.add_argument("--mixed", action="store_true", help="with --batch-sizes: B prompts of B different lengths")
    p.add_argument("--requests", type=int, default=0, help="greedy decoding of N requests, cached against plain (above)")
    p.add_argument("--batch-size", type=int, default=32, help="requests per batch with --requests (default 32)")
    p.add_argument("--compile", action="store_true",
                   help="also time cached generation with the compiled step (`generate(compile=True)`; its "
                        "compile time is printed apart, once per batch size and thread count)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.checkpoint:
        model = from_pretrained(args.checkpoint)
        what, cfg = args.checkpoint, model.info.config
    else:
        cfg = load_config("cpu_default", [f"boundaries.name={args.strategy}"] if args.strategy else [])
        torch.manual_seed(0)
        model = ByteUNet(cfg.model, cfg.boundaries).eval()
        what = "random weights"
    if args.batch_sizes:
        return side_by_side(model, cfg, what, args)
    if args.requests:
        return greedy_requests(model, cfg, what, args)
    c = model.cfg
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {what}; d={c.d_model}, {c.n_down_layers}/{c.n_mid_layers}/{c.n_up_layers} layers, window {c.window}, "
          f"{model.boundaries.name} boundaries, {n_params / 1e6:.2f}M parameters; torch threads {torch.get_num_threads()}")

    def run(n: int, **kw):
        t0 = time.perf_counter()
        g = generate(model, args.prompt, max_bytes=n, seed=args.seed, stop_on_eos=False, threads=None, **kw)
        return g, time.perf_counter() - t0

    n_full = args.uncached_bytes or args.bytes
    rows = [("cached (kv caches, step)", args.bytes, {})]
    if args.compile:
        rows.append(("cached, compiled step", args.bytes, {"compile": True}))
    rows.append(("full forward per byte, prefix", n_full, {"use_cache": False, "pad_uncached": False}))
    if not args.skip_padded:
        rows.append(("full forward per byte, padded", n_full, {"use_cache": False, "pad_uncached": True}))
    results = []
    for name, n, kw in rows:
        _, warm = run(8, **kw)  # warm up (numba compile of the scan for the uncached rows, allocator; compiling)
        if kw.get("compile"):
            print(f"  compiling the step: {warm:.1f} s", file=sys.stderr)
        g, seconds = run(n, **kw)
        results.append((name, n, seconds, g))
        print(f"  {name}: {n} bytes in {seconds:.2f} s", file=sys.stderr)

    cached_rate = results[0][1] / results[0][2]
    print(f"\n{'mode':<32} {'bytes':>6} {'seconds':>8} {'bytes/s':>9} {'ms/byte':>8} {'cached is':>10}")
    for name, n, seconds, _ in results:
        rate = n / seconds
        print(f"{name:<32} {n:>6} {seconds:>8.2f} {rate:>9.1f} {1e3 / rate:>8.2f} {cached_rate / rate:>9.1f}x")
    reference, reference_n = results[0][3], results[0][1]
    for name, n, _, g in results[1:]:
        if n != reference_n:  # a different budget gives `uniform` a different pattern: not comparable
            continue
        same = g.data == reference.data and g.boundaries == reference.boundaries
        print(f"same bytes and boundaries as cached ({name}): {'yes' if same else 'NO'}")
    return 0


def side_by_side(model, cfg, what: str, args) -> int:
    """Cached generation at each batch size beside a training step, per thread count."""
    from throughput import Run, measure

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(f"model: {what}; {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"{model.boundaries.name} boundaries; {args.bytes} bytes per row after a {len(args.prompt.encode())}-byte prompt"
          f"{' (and one to B - 1 bytes longer)' if args.mixed else ''}; "
          f"training step: {cfg.train.batch_size} x {cfg.train.seq_len} bytes")
    modes = [("", False)] + ([(" compiled", True)] if args.compile else [])
    header = f"{'threads':>7} {'train step bytes/s':>19}" + "".join(
        f" {f'gen B={b}{mode} bytes/s':>{17 + len(mode)}} {'/ train':>8}" for b in sizes for mode, _ in modes)
    print(header)
    for threads in (int(t) for t in args.thread_counts.split(",")):
        torch.set_num_threads(threads)
        (train,) = measure([Run(cfg, torch.device("cpu"), bf16=False, compile_model=False)], steps=5, warmup=2)
        row = f"{threads:>7} {train['bytes_s']:>19.0f}"
        for b in sizes:
            # B prompts of the prompt's length (distinct bytes), or (--mixed) of B lengths
            prompts = [args.prompt[:-1] + chr(33 + i % 90) * (i + 1 if args.mixed else 1) for i in range(b)]
            for mode, compile in modes:
                t0 = time.perf_counter()  # warm up (and compile the step)
                generate(model, prompts, max_bytes=8, seed=args.seed, stop_on_eos=False, threads=None, compile=compile)
                if compile:
                    print(f"  threads {threads}, B={b}: compiling the step took {time.perf_counter() - t0:.1f} s",
                          file=sys.stderr)
                t0 = time.perf_counter()
                generate(model, prompts, max_bytes=args.bytes, seed=args.seed, stop_on_eos=False, threads=None,
                         compile=compile)
                rate = b * args.bytes / (time.perf_counter() - t0)
                row += f" {rate:>{17 + len(mode)}.0f} {rate / train['bytes_s']:>8.3f}"
        print(row)
    return 0


def greedy_requests(model, cfg, what: str, args) -> int:
    """`UNetScorer.greedy_batch` against a full forward pass per byte and request."""
    import random

    from learntok.data.batch import BOS, PAD
    from learntok.eval.scorer import UNetScorer, boundary_uniforms

    T = cfg.train.seq_len
    scorer = UNetScorer(model, max_len=T, batch_size=args.batch_size)
    rng = random.Random(args.seed)
    words = "the of and a to in is was that for on with as by at from his it an were are which this be".split()
    requests = [(" ".join(rng.choice(words) for _ in range(rng.randint(20, 80))).encode(), args.bytes, [b"\n\n"])
                for _ in range(args.requests)]
    print(f"model: {what}; {model.boundaries.name} boundaries; {len(requests)} requests of up to {args.bytes} bytes, "
          f"rows of {T} positions; torch threads {torch.get_num_threads()}")
    scorer.greedy_batch(requests[:1])  # warm-up, as the full forward below runs warm: first calls cost ~0.7 s
    t0 = time.perf_counter()
    cached = scorer.greedy_batch(requests)
    cached_s = time.perf_counter() - t0
    u = boundary_uniforms(0, T)[None] if model.boundaries.stochastic else None
    t0 = time.perf_counter()
    plain = []
    for context, n, stops in requests:
        keep, new = context[max(0, len(context) - (T - 1 - n)):], b""
        for _ in range(n):
            data = keep + new
            width = T if model.boundaries.length_dependent else len(data) + 1  # padded as the scorer pads
            inputs = torch.full((1, width), PAD)
            inputs[0, 0] = BOS
            inputs[0, 1:len(data) + 1] = torch.tensor(list(data))
            with torch.inference_mode():
                byte = int(model(inputs, uniforms=None if u is None else u[:, :width]).logits[0, len(data)].argmax())
            if byte > 255:
                break
            new += bytes([byte])
            if any(new.endswith(s) for s in stops):
                break
        plain.append(new)
    plain_s = time.perf_counter() - t0
    n_bytes = sum(map(len, cached))
    print(f"{'mode':<36} {'seconds':>8} {'bytes/s':>9}")
    print(f"{'cached, batch of ' + str(args.batch_size):<36} {cached_s:>8.2f} {n_bytes / cached_s:>9.0f}")
    print(f"{'full forward per byte and request':<36} {plain_s:>8.2f} {sum(map(len, plain)) / plain_s:>9.0f}")
    print(f"cached is {plain_s / cached_s:.1f}x; the same bytes: {'yes' if cached == plain else 'NO'}")
    return 0 if cached == plain else 1


if __name__ == "__main__":
    sys.exit(main())
