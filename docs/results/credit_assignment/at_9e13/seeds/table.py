"""The learned policy from scratch (D = 1, no probe) against uniform boundaries at rate 0.2, 9.153e13 FLOPs, seed
by seed: held-out bpb as compare reported it (seeds 1 and 2: its first 64 val sequences, as section 16's seed 0),
on all 418 packed val sequences and on all 89 val documents, and the difference learned - uniform with its
standard error paired over the documents (and over the 418 sequences).

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
    return {"compare": compare["bpb"], "whitespace_precision": compare["whitespace_precision"],
            "word_start_precision": compare["word_start_precision"], "rate": compare["rate"], "bytes": compare["bytes"],
            "sequences": seq, "documents": doc,
            "result": TaskResult("heldout", len(doc["doc_bpb"]), doc["bpb"], doc["bpb_se"], item_bpb=doc["doc_bpb"],
                                 item_bytes=[float(n) for n in doc["doc_bytes"]])}


print("| seed | strategy | 64 sequences (compare) | 418 sequences | 89 documents | rate | whitespace precision | "
      "word-start precision | training bytes |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
rows, diffs = {}, []
for s in seeds:
    rows[s] = {k: scores(f"xl_{run}_s{s}") for k, run in (("learned", "d1"), ("uniform", "uniform"))}
    for k, r in rows[s].items():
        print(f"| {s} | {k} | {r['compare']:.4f} | {r['sequences']['bpb']:.4f} | {r['documents']['bpb']:.4f} | "
              f"{r['rate']:.3f} | {r['whitespace_precision']:.3f} | {r['word_start_precision']:.3f} | "
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
    diffs.append(doc_d)
    print(f"| {s} | {learned['compare'] - uniform['compare']:+.4f} | {seq_d:+.4f} ± {seq_se:.4f} | "
          f"{doc_d:+.4f} ± {doc_se:.4f} |")
if len(diffs) > 1:
    print(f"\nMean over seeds on the documents: {statistics.mean(diffs):+.4f} "
          f"(± {statistics.stdev(diffs) / len(diffs) ** 0.5:.4f} over seeds)")
