"""Benchmark readers, bits-per-byte scoring and the Table 1 report (learntok.eval)."""

from __future__ import annotations

import gzip
import json
import math
import sys
import types
from pathlib import Path

import pytest

from learntok.eval.benchmarks import (
    TASKS,
    BenchmarkFormatError,
    BenchmarkUnavailableError,
    ByteScorer,
    ContinuationScore,
    LambadaItem,
    MultipleChoiceItem,
    TaskResult,
    evaluate_lambada,
    evaluate_multiple_choice,
    evaluate_task,
    evaluate_text,
    hellaswag_preprocess,
    iter_records,
    lambada_item,
    load_benchmark,
    mean_and_se,
    paired_difference,
    ratio_and_se,
    read_arc_easy,
    read_hellaswag,
    read_lambada,
    read_piqa,
    score_pairs,
)
from learntok.eval.report import (
    format_cell,
    paired_rows,
    read_report_json,
    render_json,
    render_markdown,
    write_report,
)

# <repo>/../shared/data/eval (== Path(__file__).parents[2] / "shared" / ...; .parent never raises)
SHARED_EVAL = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "eval"
LN2 = math.log(2)

needs_shared = pytest.mark.skipif(
    not SHARED_EVAL.is_dir(), reason=f"shared eval data not present at {SHARED_EVAL}"
)


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def write_jsonl(path: Path, records, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


class UnigramScorer:
    """Context-free byte model: p(' ')=1/2, p('a')=1/4, p('b')=1/8, the remaining 1/8 spread
    evenly over the other 253 bytes. So ' ' costs 1 bit, 'a' 2 bits, 'b' 3 bits. Greedy decoding
    always emits ' ', unless ``greedy`` says otherwise."""

    def __init__(self, greedy=None):
        self.calls: list[int] = []
        self.greedy = greedy

    @staticmethod
    def bits(byte: int) -> float:
        if byte == ord(" "):
            return 1.0
        if byte == ord("a"):
            return 2.0
        if byte == ord("b"):
            return 3.0
        return math.log2(253 * 8)

    def score(self, pairs):
        self.calls.append(len(pairs))
        out = []
        for ctx, cont in pairs:
            nll = sum(self.bits(b) for b in cont) * LN2
            g = self.greedy(ctx, cont) if self.greedy else all(b == ord(" ") for b in cont)
            out.append(ContinuationScore(nll, len(cont), g))
        return out


# ------------------------------------------------------------------------------------------
# readers on records written here (HF schemas)
# ------------------------------------------------------------------------------------------


def test_piqa_reader_hf_schema(tmp_path):
    recs = [
        {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "eat the lid", "label": 0},
        {"goal": "Dry hair", "sol1": "use water", "sol2": "use a towel", "label": 1},
        {"goal": "Cut bread", "sol1": "a knife", "sol2": "a spoon", "label": "0"},
    ]
    items = list(read_piqa(write_jsonl(tmp_path / "p.jsonl", recs)))
    assert [i.gold for i in items] == [0, 1, 0]
    assert items[0].context == "Question: Open a jar\nAnswer:"
    assert items[1].candidates == [" use water", " use a towel"]
    assert items[0].pairs()[0] == (b"Question: Open a jar\nAnswer:", b" twist the lid")
    # gzip and limit
    gz = write_jsonl(tmp_path / "p.jsonl.gz", recs, gz=True)
    assert [i.gold for i in read_piqa(gz, limit=2)] == [0, 1]


def test_hellaswag_reader_hf_schema_and_preprocessed(tmp_path):
    recs = [
        {  # original HF layout: ctx_b non-empty, capitalised; [title] / [step] artefacts
            "ind": 24,
            "activity_label": "Home and Garden",
            "ctx_a": "[header] How to paint a wall [title] Clean the wall.",
            "ctx_b": "then",
            "ctx": "[header] How to paint a wall [title] Clean the wall. then",
            "endings": ["paint it [step] Wait.", "eat it.", "sing.", "run."],
            "label": "0",
        },
        {  # preprocessed release: ctx_b empty, ctx holds everything
            "ind": 25,
            "activity_label": "Canoeing",
            "ctx_a": "",
            "ctx_b": "",
            "ctx": "Two people paddle a canoe. they",
            "endings": ["sink.", "row on.", "fly.", "sleep."],
            "label": "1",
        },
        {  # ctx_b empty, ctx_a only (harness formula: ctx_a + " " stripped)
            "ind": 26,
            "activity_label": "Running",
            "ctx_a": "A man runs. he",
            "ctx_b": "",
            "endings": ["stops.", "goes."],
            "label": 1,
        },
    ]
    items = list(read_hellaswag(write_jsonl(tmp_path / "h.jsonl", recs)))
    a, b, c = items
    # " [title]" -> ". ", other [..] removed, double spaces collapsed, ctx_b capitalised
    assert a.context == "Home and Garden: How to paint a wall. Clean the wall. Then"
    assert a.candidates == [" paint it Wait.", " eat it.", " sing.", " run."]
    assert (a.id, a.gold) == ("24", 0)
    assert b.context == "Canoeing: Two people paddle a canoe. they"
    assert b.gold == 1
    assert c.context == "Running: A man runs. he" and c.candidates == [" stops.", " goes."]
    # strip happens before the bracket removal, as in the harness, so a trailing [..] leaves a space
    assert hellaswag_preprocess("  x [title] y  z [foo]") == "x. y z "


def test_arc_reader_hf_schema(tmp_path):
    recs = [
        {"id": "Q1", "question": "What is hot?",
         "choices": {"text": ["ice", "fire", "snow", "rain"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
        {"id": "Q2", "question": "Pick three?",  # digit labels, 3 choices
         "choices": {"text": ["one", "two", "three"], "label": ["1", "2", "3"]},
         "answerKey": "3"},
        {"id": "Q3", "question": "Five?",
         "choices": {"text": list("vwxyz"), "label": list("ABCDE")}, "answerKey": "E"},
    ]
    path = tmp_path / "arc.json"  # a .json list this time
    path.write_text(json.dumps(recs), encoding="utf-8")
    items = list(read_arc_easy(path))
    assert [(i.id, i.gold, len(i.candidates)) for i in items] == [("Q1", 1, 4), ("Q2", 2, 3), ("Q3", 4, 5)]
    assert items[0].context == "Question: What is hot?\nAnswer:"
    assert items[0].candidates[1] == " fire"


def test_lambada_split_worked_example(tmp_path):
    it = lambada_item({"text": "He opened the door and saw his old friend Tom"}, 7)
    assert it.context == "He opened the door and saw his old friend"
    assert it.target_word == "Tom"
    assert it.continuation == " Tom"
    assert it.pair() == (b"He opened the door and saw his old friend", b" Tom")
    assert it.text == "He opened the door and saw his old friend Tom"
    # split on the space character only (harness text.split(' ')): a newline stays in the word
    nl = lambada_item({"text": "to do with the\ngloves"})
    assert (nl.context, nl.target_word) == ("to do with", "the\ngloves")
    # UTF-8: the byte count of the continuation is that of the encoded word plus the space
    u = lambada_item({"text": "un caf\u00e9"})
    assert u.pair()[1] == b" caf\xc3\xa9"
    items = list(read_lambada(write_jsonl(tmp_path / "l.jsonl", [{"text": "a b c"}, {"text": "x y"}])))
    assert [(i.context, i.target_word) for i in items] == [("a b", "c"), ("x", "y")]


def test_iter_records_layouts(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps({"rows": [{"row": {"text": "a b"}}]}))
    loc = f"{tmp_path / 'rows.json'}: record 0"
    assert list(iter_records(tmp_path / "rows.json")) == [(loc, {"text": "a b"})]
    with gzip.open(tmp_path / "d.json.gz", "wt", encoding="utf-8") as f:
        json.dump({"data": [{"text": "c d"}]}, f)
    assert [i for i in read_lambada(tmp_path / "d.json.gz")] == [LambadaItem("0", "c", "d")]
    (tmp_path / "blank.jsonl").write_text('\n{"text": "e f"}\n\n')
    assert [loc.rsplit(":", 1)[1] for loc, _ in iter_records(tmp_path / "blank.jsonl")] == ["2"]


def test_load_benchmark_from_directory(tmp_path):
    write_jsonl(tmp_path / "piqa_validation.jsonl", [{"goal": "g", "sol1": "a", "sol2": "b", "label": 1}])
    items = load_benchmark("piqa", tmp_path)
    assert len(items) == 1 and items[0].gold == 1
    with pytest.raises(FileNotFoundError):
        load_benchmark("hellaswag", tmp_path)
    with pytest.raises(FileNotFoundError):
        read_piqa(tmp_path / "missing.jsonl")  # fails at the call, not lazily
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("winogrande", tmp_path)


# ------------------------------------------------------------------------------------------
# malformed records
# ------------------------------------------------------------------------------------------


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"goal": "g", "sol1": "a", "sol2": "b", "label": 0}) + "\n" + "{not json\n",
        encoding="utf-8",
    )
    with pytest.raises(BenchmarkFormatError, match=r"bad\.jsonl:2: invalid JSON"):
        list(read_piqa(path))


def test_malformed_record_names_file_and_line(tmp_path):
    good = {"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
    path = write_jsonl(tmp_path / "p.jsonl", [good, good, {"goal": "g", "sol1": "a", "label": 0}])
    with pytest.raises(BenchmarkFormatError, match=r"p\.jsonl:3: .*missing field 'sol2'"):
        list(read_piqa(path))
    # unlabelled split (HF PIQA test has label -1)
    path = write_jsonl(tmp_path / "t.jsonl", [dict(good, label=-1)])
    with pytest.raises(BenchmarkFormatError, match=r"t\.jsonl:1: .*out of range"):
        list(read_piqa(path))
    # ARC answer key that is not a label
    arc = {"id": "x", "question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}
    path = write_jsonl(tmp_path / "a.jsonl", [arc])
    with pytest.raises(BenchmarkFormatError, match=r"a\.jsonl:1: answerKey 'C'"):
        list(read_arc_easy(path))
    # a JSON list file names the record index
    jpath = tmp_path / "h.json"
    jpath.write_text(json.dumps([{"activity_label": "x", "ctx": "c", "endings": "notalist", "label": 0}]))
    with pytest.raises(BenchmarkFormatError, match=r"h\.json: record 0: .*endings"):
        list(read_hellaswag(jpath))
    # non-object line
    path = tmp_path / "l.jsonl"
    path.write_text('{"text": "a b"}\n[1, 2]\n')
    with pytest.raises(BenchmarkFormatError, match=r"l\.jsonl:2: expected a JSON object"):
        list(read_lambada(path))


# ------------------------------------------------------------------------------------------
# Hugging Face path (no network: the datasets module is faked or hidden)
# ------------------------------------------------------------------------------------------


def test_hf_missing_datasets_is_a_clean_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(BenchmarkUnavailableError, match="datasets"):
        read_piqa()


def test_hf_load_dataset_path(monkeypatch):
    calls = []

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        if path == "allenai/ai2_arc":
            return [{"id": "a", "question": "q", "choices": {"text": ["x", "y"], "label": ["A", "B"]},
                     "answerKey": "B"}]
        raise ConnectionError("offline")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    items = list(read_arc_easy())
    assert calls == [("allenai/ai2_arc", "ARC-Easy", "test")]
    assert items[0].gold == 1
    list(read_arc_easy(hf_name="ARC-Challenge"))
    assert calls[-1] == ("allenai/ai2_arc", "ARC-Challenge", "test")
    with pytest.raises(BenchmarkUnavailableError, match="offline"):
        read_lambada()


# ------------------------------------------------------------------------------------------
# readers on the real shared files
# ------------------------------------------------------------------------------------------


@needs_shared
def test_real_piqa():
    items = list(read_piqa(SHARED_EVAL / "piqa_validation.jsonl.gz", limit=4))
    assert len(items) == 4
    assert items[0].context == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert items[0].candidates[0].startswith(" Provide the guinea pig with a cage full")
    assert items[0].gold == 0 and items[1].gold == 1
    assert items[1].candidates == [" replace drawer with bobby pin ", " finish, woodgrain with  bobby pin "]


@needs_shared
def test_real_hellaswag():
    items = list(read_hellaswag(SHARED_EVAL / "hellaswag_validation.jsonl.gz", limit=3))
    assert items[0].context == "Roof shingle removal: A man is sitting on a roof. he"
    assert items[0].candidates[3] == " starts pulling up roofing on a roof."
    assert [i.gold for i in items] == [3, 3, 2]
    assert items[1].context.startswith("Clean and jerk: A lady walks to a barbell.")


@needs_shared
def test_real_arc_easy():
    items = list(read_arc_easy(SHARED_EVAL / "arc_easy_test.jsonl.gz", limit=3))
    assert items[0].id == "Mercury_417466" and items[0].gold == 0
    assert items[0].candidates[0] == " Sunlight is the source of energy for nearly all ecosystems."
    assert items[1].gold == 1 and items[1].candidates[1] == " breathing mask"


@needs_shared
def test_real_lambada():
    items = list(read_lambada(SHARED_EVAL / "lambada_openai_test.jsonl.gz", limit=3))
    assert items[0].target_word == "signs"
    assert items[0].context.endswith("I don't care about")
    assert items[1].target_word == "Shane"


@needs_shared
def test_real_files_parse_completely():
    sizes = {t: len(load_benchmark(t, SHARED_EVAL)) for t in TASKS}
    assert sizes == {"piqa": 1838, "hellaswag": 10042, "arc_easy": 2376, "lambada": 5153}


@needs_shared
def test_real_end_to_end_with_fake_scorer():
    s = UnigramScorer()
    r = evaluate_task("arc_easy", s, SHARED_EVAL, limit=20, batch_size=16, progress=False)
    assert r.name == "arc_easy" and r.n == 20 and 0 <= r.acc <= 1 and r.bpb > 0
    assert max(s.calls) <= 16


# ------------------------------------------------------------------------------------------
# scoring maths
# ------------------------------------------------------------------------------------------


def test_unigram_scorer_is_a_byte_scorer():
    assert isinstance(UnigramScorer(), ByteScorer)
    assert ContinuationScore(3 * LN2, 2).bpb == pytest.approx(1.5)


def test_multiple_choice_worked_example():
    # bpb per candidate: " a" = (1+2)/2 = 1.5, " b" = (1+3)/2 = 2.0, " aa" = 5/3, " ab" = 6/3 = 2.0
    items = [
        MultipleChoiceItem("1", "ctx one", [" a", " b"], 0),         # gold 1.5, pick 0: right
        MultipleChoiceItem("2", "ctx two", [" b", " aa"], 0),        # gold 2.0, pick 1: wrong
        MultipleChoiceItem("3", "ctx three", [" ab", " a", " b"], 1),  # gold 1.5, pick 1: right
    ]
    s = UnigramScorer()
    r = evaluate_multiple_choice(items, s, batch_size=3, name="toy", progress=False)
    assert (r.name, r.n) == ("toy", 3)
    # gold bpb: mean(1.5, 2, 1.5) = 5/3; sample var = (1/36 + 1/9 + 1/36)/2 = 1/12; SE = sqrt(1/12/3) = 1/6
    assert r.bpb == pytest.approx(5 / 3)
    assert r.bpb_se == pytest.approx(1 / 6)
    # acc: mean(1, 0, 1) = 2/3; sample var = (1/9 + 4/9 + 1/9)/2 = 1/3; SE = sqrt(1/3/3) = 1/3
    assert r.acc == pytest.approx(2 / 3)
    assert r.acc_se == pytest.approx(1 / 3)
    assert r.item_bpb == pytest.approx([1.5, 2.0, 1.5])
    assert r.extra["chance_acc"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    assert s.calls == [3, 3, 1]  # 7 pairs in batches of 3
    # limit
    r1 = evaluate_multiple_choice(items, UnigramScorer(), limit=1, progress=False)
    assert r1.n == 1 and r1.bpb == pytest.approx(1.5) and math.isnan(r1.bpb_se)


def test_multiple_choice_with_several_boundary_draws_worked_example():
    from learntok.eval.scorer import ModelScore

    draws = {b" a": (2.0, 1.0), b" abcd": (4.0, 3.0)}  # NLL (nats) of each candidate under draws 0 and 1
    scorer = lambda pairs: [ModelScore(sum(draws[c]) / 2, len(c), None, sample_nll=draws[c]) for _, c in pairs]
    item = MultipleChoiceItem("1", "ctx", [" a", " abcd"], 1)
    r = evaluate_multiple_choice([item], scorer, progress=False)
    # per byte: draw 0 gives 1.0 against 0.8, the gold; draw 1 gives 0.5 against 0.6, not the gold (by summed
    # NLL neither draw would pick it); the mean over draws, 0.75 against 0.7, picks it
    assert r.acc == 1.0 and r.extra["acc_per_sample"] == [1.0, 0.0]
    assert r.extra["bpb_per_sample"] == pytest.approx([0.8 / LN2, 0.6 / LN2])
    assert r.extra["bpb_std_over_samples"] == pytest.approx(0.2 / LN2 / math.sqrt(2))  # sample std of two


def test_score_pairs_restores_order_and_checks_scores():
    pairs = [(b"", b" a"), (b"long context here", b" b"), (b"x", b" ab")]
    out = score_pairs(pairs, UnigramScorer(), batch_size=2, progress=False)
    assert [o.bpb for o in out] == pytest.approx([1.5, 2.0, 2.0])
    # a plain callable works as a scorer too
    out2 = score_pairs(pairs, UnigramScorer().score, batch_size=1, progress=False, sort_by_length=False)
    assert out2 == out

    def short(pairs):
        return [ContinuationScore(1.0, len(c) - 1) for _, c in pairs]

    with pytest.raises(ValueError, match="n_bytes"):
        score_pairs(pairs, short, progress=False)
    with pytest.raises(ValueError, match="non-finite"):
        score_pairs(pairs, lambda ps: [ContinuationScore(math.nan, len(c)) for _, c in ps], progress=False)
    with pytest.raises(ValueError, match="scores for"):
        score_pairs(pairs, lambda ps: [], progress=False)


def test_lambada_scoring_worked_example():
    items = [lambada_item({"text": "x y a"}), lambada_item({"text": "x ab"})]
    assert [i.continuation for i in items] == [" a", " ab"]
    # the leading space is scored: " a" = 3 bits / 2 bytes, " ab" = 6 bits / 3 bytes
    s = UnigramScorer(greedy=lambda ctx, cont: cont == b" a")
    r = evaluate_lambada(items, s, progress=False)
    assert r.bpb == pytest.approx(1.75)
    assert r.bpb_se == pytest.approx(0.25)  # std of (1.5, 2.0) = 0.3536; / sqrt 2
    assert r.acc == pytest.approx(0.5) and r.acc_se == pytest.approx(0.5)
    assert r.extra["word_nll_nats_mean"] == pytest.approx(4.5 * LN2)

    class NoGreedy(UnigramScorer):
        def score(self, pairs):
            return [ContinuationScore(x.nll_nats, x.n_bytes, None) for x in super().score(pairs)]

    r2 = evaluate_lambada(items, NoGreedy(), progress=False)
    assert r2.acc is None and r2.acc_se is None and r2.bpb == pytest.approx(1.75)


def test_text_scoring_worked_example():
    # "ab" = 5 bits / 2 bytes, " a" = 3 bits / 2 bytes, "" skipped -> pooled 8 bits / 4 bytes = 2.0
    r = evaluate_text(["ab", " a", ""], UnigramScorer(), progress=False)
    assert r.n == 2 and r.extra["skipped_empty"] == 1 and r.extra["n_bytes"] == 4
    assert r.bpb == pytest.approx(2.0)
    # ratio SE: residuals 5 - 2*2 = 1, 3 - 2*2 = -1; sqrt(2 / (2*1)) / mean bytes 2 = 0.5
    assert r.bpb_se == pytest.approx(0.5)
    assert r.extra["mean_doc_bpb"] == pytest.approx(2.0)
    assert r.acc is None
    # UTF-8 encoding of str documents; bytes documents pass through
    r2 = evaluate_text(["\u00e9", b"\xc3\xa9"], UnigramScorer(), progress=False)
    assert r2.extra["n_bytes"] == 4


def test_mean_and_ratio_se_helpers():
    m, se = mean_and_se([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and se == pytest.approx(math.sqrt(5 / 3 / 4))
    r, rse = ratio_and_se([2.0, 4.0], [1.0, 2.0])
    assert r == pytest.approx(2.0) and rse == pytest.approx(0.0)
    assert all(math.isnan(x) for x in mean_and_se([]))


def test_paired_difference_worked_examples():
    # benchmarks weigh items equally: differences 0.1, 0.1, 0.4 -> mean 0.2, sd sqrt(0.03), SE 0.1
    base = TaskResult("piqa", 3, 2.0, 0.58, item_bpb=[1.0, 2.0, 3.0])
    other = TaskResult("piqa", 3, 2.2, 0.67, item_bpb=[1.1, 2.1, 3.4])
    delta, se = paired_difference(base, other)
    assert delta == pytest.approx(0.2) and se == pytest.approx(0.1)
    # held-out text is pooled over bytes: documents of 10, 20, 10 bytes; both pool to 80 / 40 = 2.0, and the
    # byte-weighted differences 5, 0, -5 give SE sqrt(50 / (3 * 2)) / (40 / 3)
    base = TaskResult("heldout", 3, 2.0, 0.0, item_bpb=[1.0, 2.0, 3.0], item_bytes=[10.0, 20.0, 10.0])
    other = TaskResult("heldout", 3, 2.0, 0.0, item_bpb=[1.5, 2.0, 2.5], item_bytes=[10.0, 20.0, 10.0])
    delta, se = paired_difference(base, other)
    assert delta == pytest.approx(0.0, abs=1e-12) and se == pytest.approx(math.sqrt(50 / 6) / (40 / 3))
    # the difference of the pooled bpb, whatever the weights
    shifted = TaskResult("heldout", 3, 0.0, 0.0, item_bpb=[1.0, 2.5, 3.0], item_bytes=[10.0, 20.0, 10.0])
    assert paired_difference(base, shifted)[0] == pytest.approx(10 / 40)
    # not the same items: no paired difference
    fewer = TaskResult("heldout", 2, 2.0, 0.0, item_bpb=[1.0, 2.0], item_bytes=[10.0, 20.0])
    other_documents = TaskResult("heldout", 3, 2.0, 0.0, item_bpb=[1.0, 2.0, 3.0], item_bytes=[20.0, 10.0, 10.0])
    assert paired_difference(base, fewer) is None and paired_difference(base, other_documents) is None
    assert paired_difference(base, TaskResult("heldout", 3, 2.0, 0.0)) is None


def test_paired_difference_of_real_scores_is_the_difference_of_the_table():
    """Two scorers on the same documents and items: the paired difference is exactly the difference of the
    bpb cells, and its SE is below the unpaired one when both models find the same items hard."""
    class Worse(UnigramScorer):  # a little worse on every byte, most on "z"
        @staticmethod
        def bits(byte: int) -> float:
            return UnigramScorer.bits(byte) + (0.5 if byte == ord("z") else 0.1)

    docs = ["aaaa aaaa aaaa", "the quick brown fox jumps over the lazy dog", "zzz"]
    flat = evaluate_text(docs, UnigramScorer(), progress=False)
    skewed = evaluate_text(docs, Worse(), progress=False)
    delta, se = paired_difference(flat, skewed)
    assert delta > 0 and delta == pytest.approx(skewed.bpb - flat.bpb)
    assert se < math.hypot(flat.bpb_se, skewed.bpb_se)


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------


def _fake_rows():
    a = {
        "piqa": TaskResult("piqa", 1838, 1.6604, 0.0112, 0.61, 0.0114, 3.0),
        "hellaswag": TaskResult("hellaswag", 10042, 1.306, 0.002, 0.28, 0.0045, 9.0),
        "lambada": TaskResult("lambada", 5153, 1.926, 0.012, 0.1, 0.004, 2.0),
        "heldout": TaskResult("heldout", 100, 1.376, 0.003, None, None, 1.0, {"n_bytes": 409600}),
    }
    b = [
        TaskResult("piqa", 1838, 1.557, 0.011, 0.63, 0.0113, 3.0),
        TaskResult("hellaswag", 10042, 1.212, 0.002, 0.29, 0.0045, 9.0),
        TaskResult("arc_easy", 2376, 2.016, 0.018, 0.42, 0.0101, 1.0),
        TaskResult("lambada", 5153, 1.737, 0.013, 0.12, 0.0045, 2.0),
        TaskResult("heldout", 100, 1.297, 0.003, None, None, 1.0),
    ]
    return {"Uniform": a, "Ours": b}


def test_format_cell():
    assert format_cell(TaskResult("x", 3, 1.2344, 0.0111)) == "1.234 \u00b1 0.011"
    assert format_cell(TaskResult("x", 1, 1.5, math.nan)) == "1.500"
    assert format_cell(None) == "\u2014"
    assert format_cell(TaskResult("x", 3, 1.0, 0.1, 0.5, 0.25), metric="acc") == "0.500 \u00b1 0.250"


def test_report_markdown_two_rows():
    md = render_markdown(_fake_rows())
    lines = md.splitlines()
    header = "| Model | PIQA | HellaSwag | ARC-Easy | LAMBADA | Held-out text |"
    assert lines.count(header) == 1
    i = lines.index(header)
    assert lines[i + 2] == (
        "| Uniform | 1.660 \u00b1 0.011 | 1.306 \u00b1 0.002 | \u2014 | "
        "1.926 \u00b1 0.012 | 1.376 \u00b1 0.003 |"
    )
    assert lines[i + 3] == (
        "| Ours | **1.557 \u00b1 0.011** | **1.212 \u00b1 0.002** | **2.016 \u00b1 0.018** | "
        "**1.737 \u00b1 0.013** | **1.297 \u00b1 0.003** |"
    )
    # accuracy table: no held-out column (no accuracy there); higher is better
    acc_header = "| Model | PIQA | HellaSwag | ARC-Easy | LAMBADA |"
    j = lines.index(acc_header)
    assert lines[j + 2].startswith("| Uniform | 0.610 \u00b1 0.011 |")
    assert "**0.630 \u00b1 0.011**" in lines[j + 3]
    plain = render_markdown(_fake_rows(), bold_best=False, with_accuracy=False)
    assert "**" not in plain and plain.count("| Model |") == 1


def test_report_json_and_files(tmp_path):
    rows = _fake_rows()
    data = json.loads(render_json(rows))
    assert [c["key"] for c in data["columns"]] == ["piqa", "hellaswag", "arc_easy", "lambada", "heldout"]
    assert [r["model"] for r in data["rows"]] == ["Uniform", "Ours"]
    ours = data["rows"][1]["results"]
    assert ours["piqa"]["bpb"] == 1.557 and ours["piqa"]["acc"] == 0.63 and ours["piqa"]["n"] == 1838
    assert ours["heldout"]["acc"] is None
    assert "arc_easy" not in data["rows"][0]["results"]
    # NaN is written as null (strict JSON)
    nan_rows = {"m": [TaskResult("piqa", 1, 1.5, math.nan, 1.0, math.nan)]}
    assert json.loads(render_json(nan_rows))["rows"][0]["results"]["piqa"]["bpb_se"] is None

    md_path, json_path = write_report(rows, tmp_path / "out", stem="t1")
    assert md_path.name == "t1.md" and json_path.name == "t1.json"
    assert md_path.read_text(encoding="utf-8") == render_markdown(rows)
    back = read_report_json(json_path)
    assert list(back) == ["Uniform", "Ours"]
    assert back["Ours"]["lambada"] == rows["Ours"][3]
    assert back["Uniform"]["heldout"].extra == {"n_bytes": 409600}


def test_report_paired_differences():
    sizes = [10.0, 20.0, 10.0]
    rows = {"base": {"piqa": TaskResult("piqa", 3, 2.0, 0.58, item_bpb=[1.0, 2.0, 3.0]),
                     "heldout": TaskResult("heldout", 3, 2.0, 0.1, item_bpb=[1.0, 2.0, 3.0], item_bytes=sizes)},
            "other": {"piqa": TaskResult("piqa", 3, 2.2, 0.67, item_bpb=[1.1, 2.1, 3.4]),
                      "heldout": TaskResult("heldout", 3, 2.0, 0.1, item_bpb=[1.5, 2.0, 2.5], item_bytes=sizes)},
            "read back": {"piqa": TaskResult("piqa", 3, 2.1, 0.6)}}  # no items: no paired cell
    assert list(paired_rows(rows)) == ["other"]
    lines = render_markdown(rows, with_accuracy=False).splitlines()
    i = lines.index("Difference from base in bits-per-byte (negative: fewer bits), \u00b1 standard error of the "
                    "difference over the same items.")
    assert lines[i + 2] == "| Model | PIQA | Held-out text |"
    assert lines[i + 4] == "| other | +0.200 \u00b1 0.100 | +0.000 \u00b1 0.217 |"
    assert len(lines) == i + 5
    paired = json.loads(render_json(rows))["paired"]
    assert paired["against"] == "base" and list(paired["rows"]) == ["other"]
    assert paired["rows"]["other"]["piqa"] == {"difference": pytest.approx(0.2), "se": pytest.approx(0.1)}
    assert "paired" not in json.loads(render_json(_fake_rows()))  # no items, no paired block
    assert "Difference from" not in render_markdown(_fake_rows())
