"""Showing segmentations (terminal, JSON, HTML, PNG) and the segment / score / generate commands."""

import gzip
import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch

from learntok import display
from learntok.cli import main
from learntok.display import Segmentation, segment
from learntok.generation import score
from learntok.hub import save_pretrained
from learntok.unet import ByteUNet

from conftest import tiny_config

TEXT = "Tokens: naïve café 東京!\n\tdef f(x): return x"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = tiny_config(name="learned", learned={"lags": 1})
    m = ByteUNet(cfg.model, cfg.boundaries).eval()
    with torch.no_grad():  # probabilities spread over (0, 1), so colours vary
        m.boundaries.proj.weight.normal_(std=8.0)
    return m


@pytest.fixture(scope="module")
def model_dir(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny"
    save_pretrained(model, path)
    return path


def hand_made() -> Segmentation:
    data = "aé b".encode()  # bytes: a, 0xC3, 0xA9, space, b
    return Segmentation(data, [0.1, 0.9, 0.3, 0.8, 0.2], [False, True, False, True, False])


def test_segmentation_api():
    seg = hand_made()
    assert seg.tokens() == [b"a\xc3", b"\xa9 ", b"b"]
    chars = seg.characters()
    assert [c.char for c in chars] == ["a", "é", " ", "b"]
    assert chars[1].prob == 0.3 and chars[1].boundary is False  # a multi-byte character takes its last byte
    pieces = seg.pieces()
    assert [(p.start, p.end, p.ended) for p in pieces] == [(0, 2, True), (2, 4, True), (4, 5, False)]
    assert b"".join(p.data for p in pieces) == seg.data
    assert str(seg) == "aé |b"  # a boundary inside a character is not shown: its last byte decides (appendix B)
    assert "<span" in seg._repr_html_()


def test_model_segment(model):
    seg = segment(model, TEXT, seed=1)
    assert seg.data == TEXT.encode() and len(seg.probs) == len(seg.boundaries) == len(seg.data)
    assert seg == segment(model, TEXT, seed=1)
    assert 0 < seg.boundary_rate < 1
    assert all(0 < p < 1 for p in seg.probs)
    # long texts are read in rows of `context` positions: pieces of context - 1 bytes, each after its own BOS
    pieces = display.segment(model, TEXT, seed=1, context=16)
    assert len(pieces.probs) == len(seg.data)


@pytest.mark.parametrize("name", ["uniform", "whitespace"])
def test_segment_reads_rows_of_the_trained_length(name):
    """Rows of `context` positions, BOS and context - 1 bytes, as training and scoring rows are; a strategy
    whose boundaries depend on the row's length (uniform) sees every row padded to `context`, so the
    boundaries shown are those the model trains and scores with."""
    from learntok.data.batch import BOS, PAD

    cfg = tiny_config(name=name)
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    text = b"a few words of text, forty bytes long..."
    shapes = []
    model.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    seg = display.segment(model, text, context=16)
    padded = model.boundaries.length_dependent
    assert shapes == [(1, 16), (1, 16), (1, 16 if padded else 11)]  # 15 + 15 + 10 bytes
    for start, n in ((0, 15), (15, 15), (30, 10)):
        row = torch.tensor([[BOS, *text[start:start + n], *[PAD] * ((15 - n) if padded else 0)]])
        with torch.no_grad():
            assert seg.boundaries[start:start + n] == model(row).boundaries.a[0, 1:n + 1].tolist()
    with pytest.raises(ValueError, match="context must be >= 2"):
        display.segment(model, text, context=1)


def test_threshold_segment(model):
    seg = segment(model, TEXT, boundaries="threshold")
    assert seg == segment(model, TEXT, seed=7, boundaries="threshold")  # no draw: the seed does not matter
    # each decision is p > 0.5, its probability computed after the earlier thresholded decisions (lags = 1)
    assert seg.boundaries == [p > 0.5 for p in seg.probs]
    assert 0 < seg.boundary_rate < 1
    sampled = segment(model, TEXT, seed=1)
    assert sampled.boundaries != [p > 0.5 for p in sampled.probs]  # sampling is not the threshold rule
    with pytest.raises(ValueError, match="unknown boundaries 'median'"):
        segment(model, TEXT, boundaries="median")
    with pytest.raises(ValueError, match=r"seed must lie in \[0, 2\*\*64\), got 18446744073709551616"):
        segment(model, TEXT, seed=2**64)  # beyond a torch generator's seeds: said, not torch's overflow


def test_quantile_segment(model):
    target = model.boundaries.cfg.target_rate
    seg = segment(model, TEXT, boundaries="quantile")
    # one threshold, chosen so that this text gets boundaries at the target rate (to within a decision or two)
    assert abs(seg.boundary_rate - target) <= 2 / len(seg.data)
    tau = display.quantile_threshold(model, TEXT)
    assert segment(model, TEXT, boundaries="quantile", tau=tau) == seg
    # each decision is logit > tau, its probability computed after the earlier decisions (lags = 1)
    u = torch.sigmoid(torch.tensor(tau)).item()
    assert seg.boundaries == [p > u for p in seg.probs]
    assert seg != segment(model, TEXT, boundaries="threshold")  # not p > 0.5: the rate decides
    assert not any(segment(model, TEXT, boundaries="quantile", tau=30.0).boundaries)
    assert segment(model, "", boundaries="quantile") == Segmentation(b"", [], [])  # nothing to calibrate on: nothing to do
    assert all(segment(model, TEXT, boundaries="quantile", tau=-30.0).boundaries)


def test_threshold_segment_other_strategies():
    cfg = tiny_config(name="random")
    with pytest.raises(ValueError, match="no per-byte boundary probability"):
        segment(ByteUNet(cfg.model, cfg.boundaries).eval(), TEXT, boundaries="threshold")
    cfg = tiny_config(name="uniform")  # deterministic: the threshold rules change nothing
    fixed = ByteUNet(cfg.model, cfg.boundaries).eval()
    assert segment(fixed, TEXT, boundaries="threshold") == segment(fixed, TEXT, seed=3)
    assert segment(fixed, TEXT, boundaries="quantile") == segment(fixed, TEXT, seed=3)


def test_segment_command_says_a_fixed_rule_has_no_threshold(tmp_path, capsys):
    cfg = tiny_config(name="whitespace")
    save_pretrained(ByteUNet(cfg.model, cfg.boundaries).eval(), tmp_path / "rule")
    assert main(["segment", str(tmp_path / "rule"), TEXT, "--json"]) == 0
    sampled = capsys.readouterr()
    assert sampled.err == ""
    assert main(["segment", str(tmp_path / "rule"), TEXT, "--json", "--boundaries", "threshold"]) == 0
    threshold = capsys.readouterr()
    assert threshold.out == sampled.out
    assert threshold.err == ("note: the whitespace boundaries are drawn by no policy, so --boundaries threshold "
                             "gives the boundaries they always give\n")


def test_terminal_rendering():
    seg = hand_made()
    assert display.render(seg, colour=False) == "aé |b"
    coloured = display.render(seg, colour=True)
    assert coloured.count("\x1b[48;2;") == 4 and coloured.count("│") == 1
    assert display.probability_colour(0.0)[2] > display.probability_colour(0.0)[0]  # blue at 0
    assert display.probability_colour(1.0)[0] > display.probability_colour(1.0)[2]  # red at 1
    # control characters show as their pictures with or without colour: a raw CR or ESC would move the cursor
    # or recolour the terminal
    data = b"ab\r\ncd\x1b[31m\x00"
    ctrl = Segmentation(data, [0.1] * len(data), [False] * len(data))
    assert display.render(ctrl, colour=False) == "ab\u240d\u21b5\ncd\u241b[31m\u2400"
    assert "\r" not in display.render(ctrl, colour=True) and "\x1b[31m" not in display.render(ctrl, colour=True)


def test_json(model):
    out = display.to_json(segment(model, TEXT))
    assert out["text"] == TEXT and out["n_bytes"] == len(TEXT.encode()) == len(out["bytes"]) == len(out["probs"])
    assert len(out["characters"]) == len(TEXT)
    assert sum(t["end"] - t["start"] for t in out["tokens"]) == out["n_bytes"]
    assert out["n_tokens"] == len(out["tokens"]) and json.loads(json.dumps(out)) == out


class Spans(HTMLParser):
    def __init__(self):
        super().__init__()
        self.spans, self.tags, self.title = [], [], None
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        attrs = dict(attrs)
        if tag == "span" and "c" in attrs.get("class", "").split():
            self.spans.append(attrs)
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.title = data
            self._in_title = False


def test_html_page(model):
    seg = segment(model, TEXT)
    page = display.to_html(seg, title="tiny <model>")
    parser = Spans()
    parser.feed(page)
    chars = seg.characters()
    assert len(parser.spans) == len(chars)
    ends = [s for s in parser.spans if "end" in s["class"].split()]
    assert len(ends) == sum(c.boundary for c in chars)
    colours = [tuple(map(int, re.search(r"background:rgb\((\d+), (\d+), (\d+)\)", s["style"]).groups()))
               for s in parser.spans]
    assert len(set(colours)) >= 5
    # redder where the probability is higher
    order = sorted(range(len(chars)), key=lambda i: chars[i].prob)
    low, high = colours[order[0]], colours[order[-1]]
    assert high[0] - high[2] > low[0] - low[2]
    assert parser.title == "tiny <model>"
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert not any(tag in ("script", "link", "img") for tag, _ in parser.tags)  # standalone


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="no headless Chromium")
def test_html_renders_in_chromium(model, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    page = tmp_path / "seg.html"
    page.write_text(display.to_html(segment(model, TEXT * 3)), encoding="utf-8")
    shot = tmp_path / "shot.png"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=900,500", page.as_uri()], capture_output=True, timeout=60)
    img = mpimg.imread(shot)
    assert img.shape[0] >= 400 and img.shape[1] >= 800
    colours = {tuple((px[:3] * 255).astype(int) // 16) for px in img.reshape(-1, img.shape[-1])[::7]}
    assert len(colours) >= 10  # coloured boxes, not a blank page


def test_png(model, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    out = display.save_png(segment(model, TEXT * 4), tmp_path / "seg.png", width=40, title="tiny")
    img = mpimg.imread(out)
    assert img.shape[0] >= 150 and img.shape[1] >= 300
    pixels = img.reshape(-1, img.shape[-1])[:, :3]
    colours = {tuple((p * 255).astype(int) // 8) for p in pixels[::5]}
    assert len(colours) >= 10
    blueish = ((pixels[:, 2] - pixels[:, 0]) > 0.2).mean()
    assert blueish > 0.02  # the glyph boxes are there


# --- commands ------------------------------------------------------------------------------------

def test_segment_command(model_dir, tmp_path, capsys):
    assert main(["segment", str(model_dir), TEXT]) == 0
    shown = capsys.readouterr()
    assert "|" in shown.out and "\x1b[" not in shown.out and "tokens" in shown.out  # not a terminal: plain separators
    assert "pieces" not in shown.err  # one row
    assert main(["segment", str(model_dir), TEXT, "--context", "11"]) == 0
    assert f"(read in {-(-len(TEXT.encode()) // 10)} pieces of at most 10 bytes, each after its own BOS" in \
        capsys.readouterr().err
    assert main(["segment", str(model_dir), TEXT, "--json", "--seed", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["text"] == TEXT
    assert main(["segment", str(model_dir), TEXT, "--boundaries", "quantile"]) == 0
    assert "threshold tau = " in capsys.readouterr().out
    assert main(["segment", str(model_dir), TEXT, "--boundaries", "quantile", "--tau", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n_tokens"] == 1 and data["tau"] == 30.0  # no boundary above that threshold
    assert main(["segment", str(model_dir), TEXT, "--tau", "0"]) == 2
    assert capsys.readouterr().err == "learntok segment: error: --tau is the threshold of --boundaries quantile\n"
    src = tmp_path / "in.txt"
    src.write_text(TEXT, encoding="utf-8")
    args = ["segment", str(model_dir), "--file", str(src), "--html", str(tmp_path / "o.html")]
    if _has_matplotlib():
        args += ["--png", str(tmp_path / "o.png")]
    assert main(args) == 0
    assert capsys.readouterr().err.startswith(f"wrote {tmp_path / 'o.html'}")
    assert (tmp_path / "o.html").read_text(encoding="utf-8").count('class="c') == len(TEXT)
    assert not _has_matplotlib() or (tmp_path / "o.png").stat().st_size > 1000
    assert main(["segment", str(tmp_path), "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("learntok segment: error: ") and "not a learntok model" in err
    assert main(["segment", str(model_dir), TEXT, "--json", "--boundaries", "threshold"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["boundaries"] == [p > 0.5 for p in data["probs"]]


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_score_command(model_dir, model, tmp_path, capsys):
    docs = [{"body": "first document"}, {"body": "zweites Dokument, länger"}]
    jsonl = tmp_path / "docs.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(d) + "\n" for d in docs))
    assert main(["score", str(model_dir), "hello", "--file", str(jsonl), "--field", "body", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["bytes"] for r in rows[:-1]] == [5, len(docs[0]["body"]), len(docs[1]["body"].encode())]
    total = rows[-1]
    assert total["documents"] == 3 and total["bytes"] == sum(r["bytes"] for r in rows[:-1])
    assert total["bpb"] == pytest.approx(sum(r["bits"] for r in rows[:-1]) / total["bytes"])
    assert rows[0]["bpb"] == pytest.approx(score(model, "hello").bpb)
    assert main(["score", str(model_dir), "hello", "world"]) == 0
    printed = capsys.readouterr()
    assert "total (2 documents" in printed.out
    assert "each document from its start, in windows of" in printed.err  # which estimator
    assert main(["score", str(model_dir), "--file", str(jsonl)]) == 2
    assert f"{jsonl}:1: no field 'text'" in capsys.readouterr().err
    # a gzipped text file is its text, and a Parquet file is read by row, as learntok eval reads them
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow
    pq.write_table(pyarrow.table({"body": [d["body"] for d in docs]}), tmp_path / "docs.parquet")
    with gzip.open(tmp_path / "one.txt.gz", "wt", encoding="utf-8") as f:
        f.write(docs[0]["body"])
    assert main(["score", str(model_dir), "--file", str(tmp_path / "docs.parquet"), "--field", "body",
                 "--file", str(tmp_path / "one.txt.gz"), "--json"]) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["bytes"] for r in again[:-1]] == [r["bytes"] for r in rows[1:-1]] + [rows[1]["bytes"]]
    assert [r["bits"] for r in again[:-1]] == pytest.approx([r["bits"] for r in rows[1:-1]] + [rows[1]["bits"]])
    # every name `prepare` reads as JSON Lines is read so here too, not scored as one text
    (tmp_path / "docs.NDJSON").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    assert main(["score", str(model_dir), "--file", str(tmp_path / "docs.NDJSON"), "--field", "body", "--json"]) == 0
    third = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["bytes"] for r in third[:-1]] == [r["bytes"] for r in rows[1:-1]]


def test_generate_command(model_dir, capsys):
    args = ["generate", str(model_dir), "--prompt", "Hi", "--max-bytes", "30", "--seed", "5", "--top-k", "50",
            "--temperature", "0.8", "--ignore-eos"]
    assert main(args) == 0
    first = capsys.readouterr()
    assert main(args) == 0
    second = capsys.readouterr()
    assert first.out == second.out and first.out.startswith("Hi")
    assert "30 bytes" in first.err and "seed 5" in first.err and "the byte budget" in first.err
    drawn = first.out[2:].rstrip("\n")  # two characters the same run draws, typed as text: ASCII ones
    stop = next(drawn[i:i + 2] for i in range(len(drawn)) if drawn[i:i + 2].isascii() and drawn[i:i + 2].isprintable()
                and len(drawn[i:i + 2]) == 2)
    assert main([*args, "--stop", stop]) == 0
    stopped = capsys.readouterr()
    assert stopped.out.rstrip("\n").endswith(stop) and first.out.startswith(stopped.out.rstrip("\n"))
    assert "a stop string" in stopped.err
    assert main([*args[:4], "--max-bytes", "0"]) == 0  # no byte drawn: the prompt alone
    assert capsys.readouterr().out == "Hi\n"
    # past the rows it trained on it still generates, and says so (transformers warns there too)
    from learntok.hub import default_context, from_pretrained
    trained = default_context(from_pretrained(model_dir)) - 1
    assert "ran past" not in first.err and 2 + 30 <= trained
    assert main([*args[:4], "--max-bytes", str(trained - 1), "--ignore-eos"]) == 0
    assert f"prompt and output ran past the {trained:,} bytes of the rows it trained on" in capsys.readouterr().err


def test_a_model_whose_boundaries_come_from_the_data_says_how_to_score_it(tmp_path, capsys):
    """A `file` model cannot make boundaries for new text: segment, score and generate say so, and point to
    what can score it (held-out text that brings its track), before printing anything else."""
    cfg = tiny_config(name="file")
    save_pretrained(ByteUNet(cfg.model, cfg.boundaries), tmp_path / "file_model")
    for argv in (["segment", str(tmp_path / "file_model"), "some text"],
                 ["score", str(tmp_path / "file_model"), "some text"],
                 ["generate", str(tmp_path / "file_model"), "-n", "3"]):
        assert main(argv) == 2
        shown = capsys.readouterr()
        assert shown.out == "" and "learntok eval" in shown.err and "--data DIR" in shown.err, argv


def test_output_to_an_ascii_terminal_escapes_what_it_cannot_show(model_dir, monkeypatch):
    """With LANG=C or PYTHONIOENCODING=ascii the commands print a character's escape, not a traceback."""
    import io
    import sys
    for argv in (["generate", str(model_dir), "--prompt", "caf\u00e9 \u2014", "--max-bytes", "0"],
                 ["segment", str(model_dir), "na\u00efve"]):
        raw = io.BytesIO()
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
        assert main(argv) == 0
        sys.stdout.flush()
        shown = raw.getvalue().decode("ascii")
        assert ("caf\\xe9 \\u2014" if argv[0] == "generate" else "\\xef") in shown


def test_generate_prints_a_character_that_the_prompt_begins_and_the_model_ends(model_dir, capsys, monkeypatch):
    import learntok.generation

    def drawn(model, prompt, *, on_bytes, **kw):  # "©" is c2 a9: the prompt typed its first byte
        on_bytes(b"\xa9x")
        return learntok.generation.Generation(prompt, b"\xa9x", "max_bytes", 0, [], [])

    monkeypatch.setattr(learntok.generation, "generate", drawn)
    assert main(["generate", str(model_dir), "--prompt", os.fsdecode(b"ab\xc2"), "--max-bytes", "2"]) == 0
    assert capsys.readouterr().out == "ab\u00a9x\n"


def test_output_piped_into_head_ends_quietly(model_dir, tmp_path):
    """`learntok segment ... | head -n 1`: once the reader has gone, the command stops without a traceback.
    The text is long enough that its output cannot all fit in the pipe before the reader closes it."""
    import subprocess
    import sys
    src = tmp_path / "long.txt"
    src.write_text(TEXT * 3000, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "learntok.cli", "segment", str(model_dir), "--file", str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1 and "Traceback" not in err, err


def test_a_broken_pipe_that_is_not_the_output_is_an_error(monkeypatch):
    """A BrokenPipeError from another pipe (a data worker's, a distributed peer's) while the output is still read
    is the command's failure: it propagates instead of ending the command quietly."""
    import types

    from learntok import cli

    def run(args):
        raise BrokenPipeError("a worker's pipe")
    monkeypatch.setattr(cli, "_command", lambda name: types.SimpleNamespace(add_arguments=lambda p: None, run=run))
    with pytest.raises(BrokenPipeError, match="worker"):
        cli.main(["segment"])


# --- bad input on the command line: one line saying what is wrong, no traceback --------------------

def test_options_may_come_between_a_commands_positionals(model_dir, capsys):
    assert main(["score", str(model_dir), "--samples", "2", "hello"]) == 0
    assert "text 1: 'hello'" in capsys.readouterr().out
    assert main(["segment", str(model_dir), "--seed", "3", "hello", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "hello"


def test_score_reads_a_bad_file_or_an_empty_document_as_the_user_means(model_dir, model, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    assert main(["score", str(model_dir), "--file", str(bad)]) == 2
    assert f"{bad}:2: field 'text' is int, not a string" in capsys.readouterr().err
    # an empty document has no bpb and no part in the mean over documents
    assert main(["score", str(model_dir), "", "hello", "hello world", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["bpb"] is None and rows[0]["bpb_samples"] == [] and rows[-1]["documents"] == 3
    assert rows[-1]["mean_document_bpb"] == pytest.approx((rows[1]["bpb"] + rows[2]["bpb"]) / 2)
    assert math.isnan(score(model, "").bpb)
    # no byte to score (an empty file, --limit 0): no bits per byte, not a perfect-looking 0.000
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["score", str(model_dir), "--file", str(tmp_path / "empty.jsonl")]) == 0
    last = capsys.readouterr().out.splitlines()[-1].split()
    assert last[:3] == ["total", "(0", "documents,"] and last[-2:] == ["0", "none"]
    assert main(["score", str(model_dir), "--file", str(bad), "--limit", "0", "--json"]) == 0
    total = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert total["documents"] == 0 and total["bpb"] is None and total["mean_document_bpb"] is None
    assert main(["score", str(model_dir), "hello", "--context", "-3"]) == 2
    assert capsys.readouterr().err == "learntok score: error: --samples, --batch-size and --context must be >= 1\n"
    # the bytes typed, also when they are not UTF-8 (a Latin-1 terminal): as the shell passes them
    assert main(["score", str(model_dir), os.fsdecode(b"caf\xe9"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["bytes"] == 4


def test_generate_refuses_settings_it_cannot_sample_with_before_it_prints(model_dir, capsys):
    for flags, message in ((["--top-p", "1.5"], "top_p must lie in"), (["-t", "nan"], "temperature must be"),
                           (["--top-k", "-3"], "top_k must be")):
        assert main(["generate", str(model_dir), "-n", "3", *flags]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("learntok generate: error: ") and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_a_device_the_machine_lacks_is_named(model_dir, capsys):
    from learntok.train.distributed import resolve_device

    assert main(["score", str(model_dir), "hello", "--device", "cuda"]) == 2
    assert "learntok score: error: device 'cuda': this PyTorch sees no CUDA GPU" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device 'gpu'"):
        resolve_device("gpu")
    assert resolve_device("auto") == torch.device("cpu")
