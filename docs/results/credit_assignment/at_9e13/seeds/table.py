"""The learned policy from scratch (D = 1, no probe) against uniform boundaries at rate 0.2, 9.153e13 FLOPs, seed
by seed: held-out bpb as compare reported it (its first 64 val sequences, as section 16's seed 0), on all 418
packed val sequences and on all 89 val documents, and the difference learned - uniform with its standard
error paired over the documents (and over the 418 sequences); the boundary rate on the documents, on the 64
sequences and in training (mean of the logged steps of the last tenth of the run).

    python table.py DOCUMENTS SEQUENCES RUNS_DIR SEEDS... > table.md
"""
import json
import statistics
import sys
from pathlib import Path

from learntok.eval.benchmarks import TaskResult, paired_difference, ratio_and_se

documents, sequences, runs = (Path(a) for a in sys.argv[1:4])
seeds = [int(s) for s in sys.argv[4:]]


def scores(name: str) -> dict:
    doc = json.loads((documents / f"{name}.json").read_text())
    seq = json.loads((sequences / f"{name}.json").read_text())
    compare = json.loads((runs / name / "results.json").read_text())["rows"][0]
    logged = [json.loads(line) for line in next((runs / name / "runs").glob("*/metrics.jsonl")).open()]
    steps = [r for r in logged if "boundary_rate" in r]
    late = [r["boundary_rate"] for r in steps if r["step"] >= 0.9 * steps[-1]["step"]]
    return {"compare": compare["bpb"], "whitespace_precision": compare["whitespace_precision"],
            "word_start_precision": compare["word_start_precision"], "rate": compare["rate"], "bytes": compare["bytes"],
            "training_rate": statistics.mean(late),
            "sequences": seq, "documents": doc,
            "result": TaskResult("heldout", len(doc["doc_bpb"]), doc["bpb"], doc["bpb_se"], item_bpb=doc["doc_bpb"],
                                 item_bytes=[float(n) for n in doc["doc_bytes"]])}


print("| seed | strategy | 64 sequences (compare) | 418 sequences | 89 documents | rate, 89 documents | "
      "rate, 64 sequences | rate, training | whitespace precision, 64 | word-start precision, 64 | training bytes |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
rows, diffs = {}, []  # diffs: (64 sequences, 418 sequences, documents) per seed
for s in seeds:
    rows[s] = {k: scores(f"xl_{run}_s{s}") for k, run in (("learned", "d1"), ("uniform", "uniform"))}
    for k, r in rows[s].items():
        print(f"| {s} | {k} | {r['compare']:.4f} | {r['sequences']['bpb']:.4f} | {r['documents']['bpb']:.4f} | "
              f"{r['documents']['boundary_rate']:.3f} | {r['rate']:.3f} | {r['training_rate']:.3f} | "
              f"{r['whitespace_precision']:.3f} | {r['word_start_precision']:.3f} | "
              f"{r['bytes'] / 1e6:.2f}M |")
print()
print("| seed | learned - uniform: 64 sequences | 418 sequences (± paired SE over sequences) | "
      "89 documents (± paired SE over documents) |")
print("|---:|---:|---:|---:|")
for s in seeds:
    learned, uniform = rows[s]["learned"], rows[s]["uniform"]
    doc_d, doc_se = paired_difference(uniform["result"], learned["result"])
    seq_l, seq_u = learned["sequences"], uniform["sequences"]
    seq_d, seq_se = ratio_and_se([a - b for a, b in zip(seq_l["sequence_bits"], seq_u["sequence_bits"])],
                                 seq_u["sequence_bytes"])
    diffs.append((learned["compare"] - uniform["compare"], seq_d, doc_d))
    print(f"| {s} | {diffs[-1][0]:+.4f} | {seq_d:+.4f} ± {seq_se:.4f} | {doc_d:+.4f} ± {doc_se:.4f} |")
if len(diffs) > 1:
    cells = [f"{statistics.mean(d):+.4f} ± {statistics.stdev(d) / len(d) ** 0.5:.4f}" for d in zip(*diffs)]
    print(f"| mean ± SE over seeds | {' | '.join(cells)} |")
