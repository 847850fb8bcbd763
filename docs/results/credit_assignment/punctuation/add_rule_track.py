"""Give a prepared dataset a `file` boundary track from a causal rule on its bytes (section 24):

    python add_rule_track.py DATASET ws|punct

ws: word starts, the `word_start` strategy's rule (a token ends at the first byte of each word); punct: word
starts plus every punctuation byte (space-like in SpaceByte's sense, but not whitespace). Track bit j belongs
to document byte j, as the loader aligns it (`Batch.boundaries[:, 1 + j]`); the byte before a document's
first is taken as space-like, as the rule takes the BOS before it."""

import sys

import torch

from learntok.analysis import whitespace_mask
from learntok.boundaries.whitespace import spacelike
from learntok.boundaries.word_start import starts_word
from learntok.data.shards import SEGMENTATION_TRACK, add_track


def rule_bits(doc: bytes, punctuation: bool):
    x = torch.frombuffer(bytearray(doc), dtype=torch.uint8).long()
    previous = torch.cat([torch.tensor([ord(" ")]), x[:-1]])
    bits = starts_word(x, previous)
    if punctuation:
        bits |= spacelike(x) & ~whitespace_mask(x)
    return bits.numpy()


if __name__ == "__main__":
    path, rule = sys.argv[1], sys.argv[2]
    punctuation = {"ws": False, "punct": True}[rule]
    info = {"rule": "word starts" + (" + every punctuation byte" if punctuation else "")}
    print(add_track(path, SEGMENTATION_TRACK, lambda docs: [rule_bits(d, punctuation) for d in docs], info))
