"""Score finished runs on every document of the prose val split, each document from its start (as
`learntok eval` does); write per-document bits per run, for paired comparisons.

    python score_documents.py OUT_DIR DATA RUN_DIR [RUN_DIR ...]
"""
import json
import sys
from pathlib import Path

import torch

from learntok.eval.heldout import evaluate_heldout, read_heldout
from learntok.eval.scorer import UNetScorer

torch.set_num_threads(1)
out, data, runs = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
out.mkdir(parents=True, exist_ok=True)
docs, what = read_heldout(data)
for run in runs:
    name = Path(run).name
    target = out / f"{name}.json"
    if target.exists():
        continue
    run_dir = next(Path(run, "runs").iterdir())  # compare's one run
    scorer = UNetScorer.from_run(run_dir, mode="sampled", samples=2, seed=0)
    res = evaluate_heldout(docs, scorer, max_len=scorer.max_len, overlap=scorer.overlap, progress=False)
    row = {"run": str(run_dir), "bpb": res.bpb, "bpb_se": res.bpb_se, "boundary_rate": scorer.boundary_rate,
           "doc_bpb": res.item_bpb, "doc_bytes": [len(d) for d in docs], "source": what, "seconds": res.seconds}
    target.write_text(json.dumps(row))
    print(f"{name}: {res.bpb:.4f} ± {res.bpb_se:.4f}, rate {scorer.boundary_rate:.3f}, {res.seconds:.0f} s", flush=True)
