"""The lm-evaluation-harness adapter, offline: local task YAMLs over JSONL files written here.

The adapter's per-request log-likelihoods must be the numbers `learntok eval` computes for the same
items (same scorer, same boundary draws)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from test_eval_cli import PIQA, make_run

from learntok.eval.benchmarks import read_piqa
from learntok.eval.scorer import UNetScorer

DOCS = ["A short held-out document.", "Another one, " * 12 + "long enough to need several windows of 64 bytes."]


def write_tasks(folder: Path, data: Path) -> None:
    (data / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PIQA))
    (data / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    # lm-eval's own piqa.yaml, pointed at the local file
    (folder / "learntok_piqa.yaml").write_text(f"""task: learntok_piqa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data / 'piqa.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{goal}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{[sol1, sol2]}}}}"
metric_list:
  - metric: acc
metadata:
  version: 1.0
""")
    (folder / "learntok_rolling.yaml").write_text(f"""task: learntok_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data / 'docs.jsonl'}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
metadata:
  version: 1.0
""")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval")
    (root / "tasks").mkdir()
    write_tasks(root / "tasks", root)
    return make_run(root / "run"), root


def test_adapter_matches_learntok_scores(setup, monkeypatch):
    run, root = setup
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.registry import get_model
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    import learntok.eval.lm_eval_adapter  # noqa: F401  (registers "learntok")

    # what simple_evaluate does, without indexing lm-eval's thousands of built-in tasks and without its
    # environment report (`pip list`): both take a minute on a busy 2-core machine
    lm = get_model("learntok").create_from_arg_string(f"pretrained={run},samples=2", {"batch_size": 4})
    manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)
    names = ["learntok_piqa", "learntok_rolling"]
    if hasattr(manager, "load"):
        tasks = manager.load(names)
    else:  # lm-eval before TaskManager.load
        from lm_eval.tasks import get_task_dict

        tasks = get_task_dict(names, manager)
    results = evaluate(lm, tasks, log_samples=True, bootstrap_iters=0)
    results["config"] = lm.get_model_info()
    scorer = UNetScorer.from_run(run, samples=2)
    # multiple choice: the requests are learntok's piqa pairs, and score the same
    items = list(read_piqa(root / "piqa.jsonl"))
    samples = sorted(results["samples"]["learntok_piqa"], key=lambda s: s["doc_id"])
    assert len(samples) == len(items)
    for sample, item in zip(samples, items):
        ours = scorer.score(item.pairs())
        assert [tuple(a) for a in sample["arguments"]] == [(item.context, c) for c in item.candidates]
        for resp, s in zip(sample["resps"], ours):
            ll, greedy = resp[0]
            assert math.isclose(ll, -s.nll_nats, rel_tol=1e-6, abs_tol=1e-6)
            assert greedy == s.greedy_match
    # rolling log-likelihood of whole documents
    rolling = sorted(results["samples"]["learntok_rolling"], key=lambda s: s["doc_id"])
    for sample, doc in zip(rolling, DOCS):
        ours = scorer.score([(b"", doc.encode())])[0]
        assert math.isclose(sample["resps"][0][0], -ours.nll_nats, rel_tol=1e-6)
    bpb = results["results"]["learntok_rolling"]["bits_per_byte,none"]
    total = sum(scorer.score([(b"", d.encode())])[0].nll_nats for d in DOCS)
    assert math.isclose(bpb, total / sum(len(d.encode()) for d in DOCS) / math.log(2), rel_tol=1e-5)
    assert results["config"]["boundary_mode"] == "sampled"


def test_generate_until_is_greedy(setup):
    from lm_eval.api.instance import Instance

    from learntok.eval.lm_eval_adapter import LearntokLM

    run, _ = setup
    lm = LearntokLM(pretrained=str(run))
    req = Instance("generate_until", {}, ("Question: what?\nAnswer:", {"until": ["\n"], "max_gen_toks": 5}), 0)
    (text,) = lm.generate_until([req], disable_tqdm=True)
    expected = lm.scorer.greedy(b"Question: what?\nAnswer:", 5, [b"\n"]).decode("utf-8", "replace").split("\n")[0]
    assert text == expected and len(text.encode("utf-8", "replace")) <= 5 * 3


def test_unknown_model_args_are_refused(setup):
    from learntok.eval.lm_eval_adapter import LearntokLM

    with pytest.raises(ValueError, match="unknown model_args"):
        LearntokLM(pretrained=str(setup[0]), temperature=0.5)
    with pytest.raises(ValueError, match="compile='maybe'; use true or false"):
        LearntokLM(pretrained=str(setup[0]), compile="maybe")


def test_a_saved_directory_scores_as_its_run_with_the_stock_models_pairs(setup, tmp_path):
    """A `save_pretrained` directory loads (lm-eval's own `trust_remote_code` flag accepted), and a context's
    trailing space moves to the continuation, as lm-eval's stock models move it."""
    import learntok
    from lm_eval.api.instance import Instance

    from learntok.eval.lm_eval_adapter import LearntokLM

    run, _ = setup
    directory = learntok.save_pretrained(learntok.from_pretrained(run), tmp_path / "model")
    lm = LearntokLM(pretrained=str(directory), trust_remote_code=True)
    assert lm.scorer.max_len == UNetScorer.from_run(run).max_len  # the trained length, from config.json
    pairs = [("The cat sat on the ", "mat"), ("The cat sat on the", " mat")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    (moved, _), (plain, _) = lm.loglikelihood(requests, disable_tqdm=True)
    (expected,) = UNetScorer.from_run(run).score([(b"The cat sat on the", b" mat")])
    # the same bytes, scored as two rows of one batch: equal up to the CPU's matmul rounding, which may differ by row
    assert math.isclose(moved, plain, rel_tol=1e-6) and math.isclose(plain, -expected.nll_nats, rel_tol=1e-6)


@pytest.mark.slow
def test_command_line(setup, tmp_path):
    """`python -m learntok.eval.lm_eval_adapter` is lm-eval's CLI with the model registered."""
    run, root = setup
    env = dict(os.environ, HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "learntok.eval.lm_eval_adapter", "--model", "learntok", "--model_args",
         f"pretrained={run}", "--tasks", "learntok_piqa", "--include_path", str(root / "tasks"),
         "--output_path", str(tmp_path / "out")],
        check=False, capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "learntok_piqa" in proc.stdout


def harness_task(path: str) -> dict:
    """One of the installed lm-evaluation-harness's task definitions (its `!function` tags kept as names)."""
    import lm_eval
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    return yaml.load((Path(lm_eval.__file__).parent / "tasks" / path).read_text(), Loader=Loader)


def test_the_four_tasks_are_built_as_the_installed_harness_builds_them():
    """`learntok eval`'s own readers against the harness's task definitions, so that a change on either side
    shows: contexts, candidates and gold answers of records that exercise every rule (double spaces, WikiHow
    brackets and [title], ctx_b's capital, digit labels, 3 to 5 choices, a newline in LAMBADA's last word)."""
    import ast
    import importlib.util

    import lm_eval
    from lm_eval.utils import apply_template

    from learntok.eval.benchmarks import arc_item, hellaswag_item, lambada_item, piqa_item

    def same(item, context: str, choices: list[str], gold: int) -> None:
        assert (item.context, item.candidates, item.gold) == (context, [" " + c for c in choices], gold)

    piqa = harness_task("piqa/piqa.yaml")
    for r in ({"goal": "How do I  boil water?", "sol1": "Put it on a stove.", "sol2": " heat it \n", "label": 1},
              {"goal": "é ünïcode {x}", "sol1": "a", "sol2": "b", "label": 0}):
        choices = ast.literal_eval(apply_template(piqa["doc_to_choice"], r))
        same(piqa_item(r), apply_template(piqa["doc_to_text"], r), choices, r["label"])
    arc = harness_task("arc/arc_easy.yaml")
    for r in ({"id": "q1", "question": "Which is a gas?", "answerKey": "B",
               "choices": {"text": ["ice", "steam", "rock"], "label": ["A", "B", "C"]}},
              {"id": "q2", "question": "Pick  one", "answerKey": "4",
               "choices": {"text": ["x", "y", "z", "w", "v"], "label": ["1", "2", "3", "4", "5"]}}):
        same(arc_item(r), apply_template(arc["doc_to_text"], r), r["choices"]["text"],
             int(apply_template(arc["doc_to_target"], r)))
    lambada = harness_task("lambada/lambada_openai.yaml")
    for text in ("He said  hello to the dog", "a b\nc", "the end of it.", 'x "quoted"'):
        item = lambada_item({"text": text})
        assert (item.context, item.continuation) == (apply_template(lambada["doc_to_text"], {"text": text}),
                                                     apply_template(lambada["doc_to_target"], {"text": text}))
    datasets = pytest.importorskip("datasets")
    assert harness_task("hellaswag/hellaswag.yaml")["process_docs"] == "utils.process_docs"
    spec = importlib.util.spec_from_file_location("hellaswag_utils", Path(lm_eval.__file__).parent / "tasks"
                                                  / "hellaswag" / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    raw = [{"ind": 0, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
            "ctx": "A man is sitting on a roof. he", "label": "3",
            "endings": ["is using wrap.", "is ripping TILES off.", "holds [a] cube.", "starts pulling."]},
           {"ind": 1, "activity_label": "Home and Garden", "ctx_b": "", "label": "0",
            "ctx_a": "[header] How to clean a rug [title] Vacuum it. [step] Use a  vacuum.",
            "ctx": "[header] How to clean a rug [title] Vacuum it. [step] Use a  vacuum.",
            "endings": ["[substeps] Do it.", "[title] Dry it [step] Wait.", " Brush it. ", "Soak it [header] x"]},
           {"ind": 2, "activity_label": "Sports", "ctx_a": "The TV shows a game.", "ctx_b": "the MAN in NYC runs",
            "ctx": "The TV shows a game. the MAN in NYC runs", "label": "1", "endings": ["fast.", "slow.", "away.", "home."]}]
    for r, doc in zip(raw, utils.process_docs(datasets.Dataset.from_list(raw))):
        same(hellaswag_item(r), doc["query"], doc["choices"], int(doc["label"]))
