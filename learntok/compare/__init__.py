"""Train several boundary strategies in one architecture at one training-FLOPs budget and compare them
(paper §4.2, figures 3 and 4; the command is `learntok compare`).

Every strategy gets the same config (architecture, optimiser, data, seed) with only `boundaries.name`
changed, so that a seed starts every strategy from the same byte model and data order (the strategy's own
layers are drawn after the byte model's: `ByteUNet.reset_parameters`) and differences are paired by seed;
and every strategy gets the same budget of training FLOPs, counted as the trainer counts them (paper §4.2: 6 per
matrix parameter per byte at the byte level, per token at the token level; cumulative `flops` in
metrics.jsonl). Strategies differ in FLOPs per byte (their realised rate, their own parameters), so
each trains on a different number of bytes:

1. the fresh model is run on the first two held-out batches (training mode, no gradient, its strategy as it
   runs after its first phases: one draw for a group that ends at `group_until_bytes`) to measure its
   FLOPs per byte, and `train.training_bytes = budget / (FLOPs per byte)` plans the run;
2. the trainer runs to the budget (`train.flops_budget`): `training_bytes` is re-planned after
   every step from the FLOPs per byte of the run so far, so the cosine schedule ends where the cumulative
   FLOPs reach the budget even when the rate drifts, and the run stops at the first step whose cumulative
   FLOPs reach it (at most one step over).

`train.eval_every` is set so that each run logs about `eval_points` held-out points (the bpb-vs-FLOPs
curves). After training, each model is evaluated on the same held-out sequences (`heldout_sequences` of the
val split, spread evenly over it, whatever the run's batch size) with the trainer's `evaluate` (boundaries
sampled: `eval_samples` seeded draws for stochastic strategies, one for deterministic ones) and measured
with `learntok.analysis.analyse` (rate, whitespace precision/recall, agreement with word and BPE
boundaries, token lengths, boundary enrichment B from the early-exit head's surprisal).

Which held-out sequences: which text is scored moves a difference between two strategies, since one
strategy finds some text easier than another does, and consecutive sequences share their documents. On a
prose corpus (418 held-out sequences of 512 bytes, 66 pairs of runs of the CPU config at each of two
budgets) the first 64 sequences moved a difference from its value on all 418 by 0.012-0.018 bpb (root mean
square), two to three times what the held-out text's standard error said, and the first 256 by 0.007-0.011,
four to five times; 64 spread evenly moved it by 0.005, 256 by 0.001-0.002, within that standard error
(docs/results/credit_assignment, section 21). Hence sequences spread evenly, and 256 of them by default,
for about a minute more evaluation per run of that config on one core (one pass over 256 sequences 6 s,
over 64 2 s; a run makes about 13). The report says how much the choice of text weighs: each run keeps
every held-out sequence's bits, and each difference between strategies gets a standard error over the
held-out sequences beside the one over seeds (`report.bpb_difference`; the seeds' spread cannot hold it,
since every run scores the same sequences). For the final word use `learntok eval`, which scores every
held-out document and gives a difference's paired standard error (docs/results/credit_assignment,
sections 20 and 21).

Running is `learntok.compare.run` (settings, the budget's plan, one run, the BPE reference), reporting
`learntok.compare.report` (table, verdicts, plots, results.json). The report folder holds table.md,
results.json, bpb_vs_flops.png, segmentation.png, segmentation.html, command.txt, and
runs/<strategy>-seed<k>/ (each a normal run directory: config.yaml, metrics.jsonl, checkpoints,
result.json). A comparison interrupted part-way continues where it stopped when run again with the same
--out: finished runs (result.json) are reused, a run with checkpoints is resumed. A finished run that was
evaluated otherwise than asked (`eval_samples`, `analysis_samples`, the paragraph) is evaluated again from
its final checkpoint, not trained again.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

from ..config import load_config
from .report import read_results, write_report
from .run import (DEFAULT_STRATEGIES, BpeReference, CompareSettings, RunResult, check_run_folders, default_paragraph,
                  run_config, train_one)

__all__ = ["DEFAULT_STRATEGIES", "CompareSettings", "RunResult", "read_results", "run_comparison"]


def run_comparison(settings: CompareSettings, log=print) -> dict:
    """Train, evaluate and analyse every strategy and seed; write the report. Returns results.json's content."""
    from ..display import Segmentation

    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    settings.out.mkdir(parents=True, exist_ok=True)
    base = load_config(settings.config, settings.overrides)
    if settings.paragraph is None:  # before the runs are checked: a finished run was segmented on it
        settings.paragraph = default_paragraph(base)
    check_run_folders(settings)
    # built on a run's config, which holds out --heldout-sequences, not the config's own train.eval_batches: the
    # dataset's BPE track is read for the sequences the runs are measured on (else the tokenizer is run per row)
    reference = BpeReference(run_config(settings, base.boundaries.name, 0))
    results, segs = [], []
    for i, strategy in enumerate(settings.strategies):
        for seed in range(settings.seeds):
            log(f"[{i + 1}/{len(settings.strategies)}] {strategy}, seed {seed} (train.seed={base.train.seed + seed})")
            r = train_one(settings, strategy, seed, reference, log=log)
            results.append(r)
            if r.status == "ok":
                log(f"  held-out bpb {r.bpb:.3f}, rate {r.analysis['summary']['rate']:.3f}, "
                    f"{r.flops:.3g} FLOPs ({r.bytes / 1e6:.2f}M bytes) in {r.wall_s / 60:.1f} min")
                if seed == 0:
                    data = json.loads((Path(r.run_dir) / "segmentation.json").read_text())
                    segs.append((strategy, Segmentation(bytes(data["bytes"]), data["probs"], data["boundaries"])))
            else:
                log(f"  {r.status}: {r.message}")
    return write_report(settings, results, segs, reference, started, time.perf_counter() - t0)
