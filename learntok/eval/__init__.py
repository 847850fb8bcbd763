"""Evaluation: bits-per-byte on held-out text and on the paper's benchmarks (§4.2, appendix D).

    benchmarks.py      readers (PIQA, HellaSwag, ARC-Easy, LAMBADA) and scoring maths against a `ByteScorer`
    nll.py             `score_rows`: the one forward-only pass behind every bits-per-byte learntok prints
    scorer.py          `UNetScorer`: the `ByteScorer` of a trained model (boundary modes, seeds, long inputs)
    heldout.py         held-out documents: sources and pooled bits-per-byte
    sequences.py       held-out sequences cut as training cuts them: a run's val_bpb, compare and the demo
    report.py          the paper's Table 1 as Markdown and JSON
    lm_eval_adapter.py the `learntok` model for lm-evaluation-harness (optional extra `eval`)

`learntok eval` (learntok/commands/eval_command.py) ties them together. Nothing here imports lm-eval except
`lm_eval_adapter`.
"""
