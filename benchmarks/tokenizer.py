"""Encoding and decoding speed of the transformers tokenizer (`learntok.hf.LearntokTokenizer`), beside
transformers' own token-by-token conversion of the same texts.

    python benchmarks/tokenizer.py --documents 2000

The texts are documents of the demo corpus (the interpreter's help topics and the standard library's
docstrings). Encoding is `tokenizer(texts)`, as `datasets.map` calls it; decoding is `batch_decode` of
the ids. The reference runs transformers' `PreTrainedTokenizer.convert_tokens_to_ids`,
`convert_ids_to_tokens` and learntok's per-token string conversion, which the tokenizer replaced with one
conversion of each text's bytes; the script checks that both give the same ids and texts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import PreTrainedTokenizer  # noqa: E402

from learntok.data.demo import demo_documents  # noqa: E402
from learntok.hf import LearntokTokenizer  # noqa: E402


class TokenByToken(LearntokTokenizer):
    """The conversions of transformers' Python tokenizers, one token at a time."""

    def convert_tokens_to_ids(self, tokens):
        return PreTrainedTokenizer.convert_tokens_to_ids(self, tokens)

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        return PreTrainedTokenizer.convert_ids_to_tokens(self, ids, skip_special_tokens)

    def convert_tokens_to_string(self, tokens):
        data = b"".join(bytes([ord(t)]) if len(t) == 1 and ord(t) < 256 else t.encode("utf-8") for t in tokens)
        return data.decode("utf-8", errors="replace")


def timed(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--documents", type=int, default=2000, help="demo-corpus documents to encode (default 2000)")
    p.add_argument("--repeats", type=int, default=3, help="timings per figure; the fastest is printed (default 3)")
    args = p.parse_args()
    texts = [text for _, text in demo_documents()[:args.documents]]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"{len(texts)} documents, {n_bytes / 1e6:.2f} MB of UTF-8; fastest of {args.repeats}")
    print("| tokenizer | encode MB/s | decode MB/s |\n|---|---|---|")
    results = {}
    for name, tokenizer in (("token by token", TokenByToken()), ("learntok", LearntokTokenizer())):
        encode_s, ids = timed(lambda: tokenizer(texts)["input_ids"], args.repeats)
        decode_s, decoded = timed(lambda: tokenizer.batch_decode(ids), args.repeats)
        results[name] = (ids, decoded)
        print(f"| {name} | {n_bytes / encode_s / 1e6:.1f} | {n_bytes / decode_s / 1e6:.1f} |")
    if results["learntok"] != results["token by token"] or results["learntok"][1] != texts:
        print("MISMATCH: the two tokenizers differ, or decoding does not give the texts back")
        return 1
    print("same ids and texts from both")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
