"""How far a FLOPs-budgeted run's re-planned learning-rate schedule strays from the schedule it would have had
planned in its final bytes from the start: the logged learning rate over the clean one, at a few steps.

    python schedule.py RUN_DIR [RUN_DIR ...] > schedule.md    (RUN_DIR: a compare's runs/<strategy>-seed0)
"""
import sys
from pathlib import Path

import yaml

from learntok.config import load_config
from learntok.train.metrics import read_metrics
from learntok.train.trainer import lr_at

STEPS = (50, 100, 110, 200, 500, 1000, 2000, 4000, 8000, 12000)
print("| run | steps | " + " | ".join(f"step {s}" for s in STEPS) + " |")
print("|---|---:|" + "---:|" * len(STEPS))
for run in sys.argv[1:]:
    run = Path(run)
    cfg = load_config(None, yaml.safe_load((run / "config.yaml").read_text()))
    rows = read_metrics(run / "metrics.jsonl")
    cfg.train.training_bytes = rows[-1]["bytes"]  # the clean plan: the bytes the run did train
    per_step = rows[0]["bytes"] / rows[0]["step"]
    by_step = {r["step"]: r for r in rows}
    # the logged lr is the step's: set from the bytes seen before it
    cells = [f"{by_step[s]['lr'] / lr_at((s - 1) * per_step, cfg.train):.3f}" if s in by_step else "" for s in STEPS]
    print(f"| {run.parent.parent.name} | {rows[-1]['step']} | " + " | ".join(cells) + " |")
