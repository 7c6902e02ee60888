"""path_collection.py as a user runs it (subprocesses) and its library run
(revision_data.collect): rows in task order, a rerun byte-identical, the
verifier through a --backend python:... double, good data without any model,
unreadable trees listed with exit 1, bad input with exit 2 and one line, a
manifest with every setting, the summary's first-bad-step histogram, and
every setting in --help."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from agent_r import revision
from agent_r.knobs import BackendSettings
from agent_r.revision_data import PathSettings, collect
from tests.support import tree_fixtures as tf
from tests.support.env_fixtures import ROOT
from tests.support.revision_cases import rows_of


CLEARED = ("TASK", "ALPHA", "BETA", "TEMP", "MODEL_DIR", "MODEL_NAME", "BACKEND", "MAX_TOKEN_LENGTH",
           "MAX_DEPTH", "ITERA", "N_GEN")


def run_script(*args, **env):
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    base.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, str(ROOT / "path_collection.py"), *map(str, args)],
                          cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)


def test_direct_revision_rerun_is_byte_identical(trees, tmp_path):
    out = tmp_path / "data"
    first = run_script("--input_dir", trees, "--output_dir", out, "--revise", 0, TASK="textcraft")
    assert first.returncode == 0, first.stderr
    jsonl = out / "textcraft_centric.jsonl"
    data = jsonl.read_bytes()
    rows = rows_of(jsonl)
    # task order 3, 12, 40, 1000; the tree without success (5) is skipped
    assert [r["task_num"] for r in rows][0] == "3" and rows[-1]["task_num"] == "1000"
    assert sorted({r["task_num"] for r in rows}, key=int) == ["3", "12", "40", "1000"]
    assert all(r["revise"] is False and r["revise_feedback"] == "" for r in rows)
    assert "trees read: 5  skipped (no success): 1  failed: 0" in first.stdout
    assert "verifier calls (prompts): 0" in first.stdout

    again = run_script("--input_dir", trees, "--output_dir", out, "--revise", 0, TASK="textcraft")
    assert again.returncode == 0 and jsonl.read_bytes() == data      # resumed from parts, no duplicates
    # recomputing from scratch gives the same bytes too (seeded)
    for part in (out / ".parts" / "textcraft_centric").iterdir():
        part.unlink()
    scratch = run_script("--input_dir", trees, "--output_dir", out, "--revise", 0, TASK="textcraft")
    assert scratch.returncode == 0 and jsonl.read_bytes() == data
    # another seed changes the choice, and the cache notices the setting change
    other = run_script("--input_dir", trees, "--output_dir", out, "--revise", 0, "--seed", 1, TASK="textcraft")
    assert other.returncode == 0 and jsonl.read_bytes() != data and len(rows_of(jsonl)) == len(rows)


def test_verifier_through_table_backend(trees, tmp_path):
    table = tmp_path / "verifier.json"
    table.write_text(json.dumps({
        "(step 1):\nAction: get 1 diamond": ["Diamonds are not in the recipe.\nJudgment: Bad"],
        "default": ["This helps.\nJudgment: Good"],
    }))
    out = tmp_path / "data"
    r = run_script("--input_dir", trees, "--output_dir", out, "--backend", "python:tests.support.doubles:table_backend",
                   TASK="textcraft", MODEL_DIR=table)
    assert r.returncode == 0, r.stderr
    rows = {r["task_num"]: r for r in rows_of(out / "textcraft_centric.jsonl")}
    fb = rows["3"]["revise_feedback"]
    assert [(f["action"], f["judgement"]) for f in fb] == [("get 1 diamond", "Bad")]
    assert [m.get("loss") for m in rows["3"]["revise_log"] if m["role"] == "assistant"] == [False, False, True] + [True] * 3
    assert "first bad step (position:paths):" in r.stdout and "unparseable judgements: 0" in r.stdout
    # a changed tree is redone alone (its 2 low-path steps); the others come from their parts
    tf.write_tree(tf.tree_split_at_root(task=tf.TASK + " Changed."), trees, 3)
    r2 = run_script("--input_dir", trees, "--output_dir", out, "--backend", "python:tests.support.doubles:table_backend",
                    TASK="textcraft", MODEL_DIR=table)
    assert r2.returncode == 0 and "(2 this run)" in r2.stdout
    again = {r["task_num"]: r for r in rows_of(out / "textcraft_centric.jsonl")}
    assert again["3"]["task_description"].endswith("Changed.") and again["12"] == rows["12"]


def test_good_data_needs_no_model_and_no_search_vars(trees, tmp_path):
    out = tmp_path / "data"
    r = run_script("--input_dir", trees, "--output_dir", out, "--data_type", "good", TASK="textcraft",
                   MODEL_DIR=tmp_path / "no-such-model")
    assert r.returncode == 0, r.stderr
    rows = rows_of(out / "textcraft_good.jsonl")
    assert rows and all(set(r) == {"task_num", "revise_log", "revise"} for r in rows)
    assert all(m["loss"] is True for r in rows for m in r["revise_log"][4:] if m["role"] == "assistant")
    assert "good samples: " + str(len(rows)) in r.stdout


def test_default_input_dir_from_model_name(trees, tmp_path):
    out = tmp_path / "data"
    r = subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "--revise", "0", "--output_dir", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**{k: v for k, v in os.environ.items() if k not in CLEARED},
                            "TASK": "textcraft", "MODEL_NAME": "m"})
    assert r.returncode == 0, r.stderr
    assert (out / "textcraft_centric.jsonl").exists()


def test_corrupt_trees_reported_and_skipped(trees, tmp_path):
    good = (trees / "search_results_3.json").read_text()
    (trees / "search_results_7.json").write_text(good[: len(good) // 2])       # truncated
    broken = json.loads(good)
    del broken["children"][0]["state"]
    (trees / "search_results_8.json").write_text(json.dumps(broken))          # missing key
    out = tmp_path / "data"
    r = run_script("--input_dir", trees, "--output_dir", out, "--revise", 0, TASK="textcraft")
    assert r.returncode == 1
    assert "search_results_7.json" in r.stderr and "search_results_8.json" in r.stderr
    assert "corrupt JSON" in r.stderr and "missing keys ['state']" in r.stderr
    assert r.stderr.count("delete the file, rerun mcts_collection.py") == 2   # one fix, no "redoing" beside it
    assert "failed: 2" in r.stdout
    assert {row["task_num"] for row in rows_of(out / "textcraft_centric.jsonl")} == {"3", "12", "40", "1000"}


@pytest.mark.parametrize("env,needle", [
    ({"ALPHA": "half"}, "ALPHA='half' is not a number"),
    ({"BETA": "0.5x"}, "BETA='0.5x' is not a number"),
    ({"BETA": "-1"}, "BETA=-1.0 is too small"),
    ({"TASK": "minecraft"}, "unknown TASK='minecraft'"),
])
def test_bad_env_values(trees, tmp_path, env, needle):
    r = run_script("--input_dir", trees, "--output_dir", tmp_path / "o", "--revise", 0, **{"TASK": "textcraft", **env})
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_empty_or_missing_input_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "manifest.json").write_text("{}")
    r = run_script("--input_dir", tmp_path / "empty", "--output_dir", tmp_path / "o", "--revise", 0, TASK="textcraft")
    assert r.returncode == 2 and "has no search_results_<idx>.json trees" in r.stderr
    r = run_script("--input_dir", tmp_path / "nope", "--output_dir", tmp_path / "o", "--revise", 0, TASK="textcraft")
    assert r.returncode == 2 and "does not exist: run mcts_collection.py first" in r.stderr


def test_collect_writes_a_manifest_with_every_setting(trees, tmp_path):
    settings = PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(tmp_path), revise=False)
    result = collect(settings)
    manifest = json.loads((tmp_path / "textcraft_centric.manifest.json").read_text())
    config = manifest["config"]
    assert set(config) == {f.name for f in dataclasses.fields(PathSettings)}
    assert set(config["backend"]) == {f.name for f in dataclasses.fields(BackendSettings)}
    assert (config["alpha"], config["beta"], config["revise"]) == (0.5, 0.5, False)
    assert manifest["stats"]["rows"] == result.rows and manifest["stats"]["failed"] == []


def test_collect_reports_unreadable_trees_and_exit_code_1(trees, tmp_path):
    (trees / "search_results_9.json").write_text("{")
    result = collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(tmp_path), revise=False))
    assert result.failed == ["search_results_9.json"] and result.exit_code == 1
    assert "search_results_9.json" in result.problem


def test_help_lists_every_setting():
    r = run_script("--help")
    assert r.returncode == 0
    for cls in (PathSettings, BackendSettings):
        for f in dataclasses.fields(cls):
            if f.metadata.get("nested"):
                continue
            flag = f.metadata["flag"]
            names = ([f"--{f.name}"] if flag is True else [flag] if flag else []) + [f.metadata["env"] or ""]
            assert any(n and n in r.stdout for n in names), f"{f.name} missing from --help"
    assert "export" in r.stdout


def test_first_bad_histogram_orders_positions_numerically():
    from collections import Counter

    assert revision.histogram(Counter({"10": 1, "2": 3, "none": 2, "1": 4})) == "1:4 2:3 10:1 none:2"
    assert revision.histogram(Counter({"3": 1})) == "3:1"
    assert revision.histogram(Counter()) == "-"
