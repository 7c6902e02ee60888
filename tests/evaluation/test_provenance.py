"""Every eval summary says what made its numbers (weights, backend, dtype,
machine, commit, the settings that change outcomes), an eval resumed on
another machine names both, and ``eval.py --compare`` warns in one line per
run when two compared runs were made under other conditions. The summary
also counts the two kinds of revision turn apart (the revision sentence; a
bare ``wait`` without it), the episodes that revise ten times or more, and
the actions the environment refused."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r import conversation as conv
from agent_r import paths
from agent_r.evaluation import evaluate
from agent_r.provenance import PROVENANCE_FIELDS, UNKNOWN
from agent_r.manifest import git_commit, machine
from agent_r.report import refused_action_counts, revision_turn_counts
from agent_r.revision import REVISION_THOUGHTS
from tests.support.doubles import ScriptedBackend
from tests.support.env_fixtures import ROOT
from tests.support.eval_runs import config, split_file
from tests.support.faults import script_env

TINY = ROOT / "models" / "textcraft-tiny"


def eval_run(cwd: Path, server: str, *args, **env) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, str(ROOT / "eval.py"), "--env_server_base", server, "--output_dir",
                          str(cwd / "out"), "--max_steps", "2", *map(str, args)], cwd=cwd,
                         env=script_env({"TASK": "textcraft", "MODEL_DIR": str(TINY), "BACKEND": "hf", "TEMP": "0", **env}),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def finished(tmp_path_factory, textcraft_server) -> Path:
    cwd = tmp_path_factory.mktemp("prov")
    eval_run(cwd, textcraft_server, "--limit", 2, MODEL_TYPE="a")
    return cwd


def test_a_summary_records_every_provenance_field(finished):
    got = summary(finished / "out" / "textcraft" / "textcraft-tiny_a")["provenance"]
    assert set(PROVENANCE_FIELDS) <= set(got)
    assert got["machines"] == [machine()] and got["commits"] == [git_commit() or UNKNOWN]
    assert got["backend"] == "hf" and got["dtype"] not in (None, UNKNOWN) and len(got["model_sha256"]) == 64
    assert got["settings"] == {"temperature": 0.0, "samples": 1, "max_steps": 2, "wait_reply": "env",
                               "max_new_tokens": got["settings"]["max_new_tokens"],
                               "max_token_length": got["settings"]["max_token_length"]}
    assert got["settings"]["max_new_tokens"] > 0 and got["settings"]["max_token_length"] > 0


def played_elsewhere(run_dir: Path, other: str) -> None:
    """As if the folder's episodes so far had been played on ``other``: what its
    manifest and (where there is one) its summary record."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["machines"] == [machine()]        # every invocation that played records its machine
    manifest["machines"] = [other]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    if (run_dir / "summary.json").exists():
        old = summary(run_dir)
        old["provenance"]["machines"] = [other]
        (run_dir / "summary.json").write_text(json.dumps(old))


def test_an_eval_resumed_on_another_machine_names_both(finished, textcraft_server):
    run_dir = finished / "out" / "textcraft" / "textcraft-tiny_a"
    played_elsewhere(run_dir, "Some Other CPU, 2 CPU cores")
    eval_run(finished, textcraft_server, "--limit", 2, MODEL_TYPE="a")     # nothing left: nothing played here
    assert summary(run_dir)["provenance"]["machines"] == ["Some Other CPU, 2 CPU cores"]
    eval_run(finished, textcraft_server, "--limit", 3, MODEL_TYPE="a")     # one more episode, played here
    assert summary(run_dir)["provenance"]["machines"] == ["Some Other CPU, 2 CPU cores", machine()]


def test_an_eval_killed_before_its_summary_and_resumed_elsewhere_names_both(tmp_path, textcraft_server):
    """A run killed at the end of a session leaves episodes and a manifest but
    no summary; the machine that finishes it must not be named alone."""
    eval_run(tmp_path, textcraft_server, "--limit", 1, MODEL_TYPE="k")
    run_dir = tmp_path / "out" / "textcraft" / "textcraft-tiny_k"
    (run_dir / "summary.json").unlink()
    played_elsewhere(run_dir, "The First CPU, 2 CPU cores")
    eval_run(tmp_path, textcraft_server, "--limit", 2, MODEL_TYPE="k")
    assert summary(run_dir)["provenance"]["machines"] == ["The First CPU, 2 CPU cores", machine()]
    assert json.loads((run_dir / "manifest.json").read_text())["machines"] == ["The First CPU, 2 CPU cores",
                                                                               machine()]


def test_a_folder_banked_while_its_eval_plays_already_names_the_machine(tmp_path, textcraft_server):
    """A long eval is banked part-way and its machine may go before the eval
    ends; what was banked must still say where its episodes were played.
    Held at a known point: the second episode's model turn reads the manifest
    the first episode's end wrote."""
    seen: list[dict] = []
    cfg = config(tmp_path, textcraft_server, split_file(tmp_path, [3, 7]), concurrency=1, max_steps=1)

    def policy(messages, i, seed):
        path = paths.eval_dir(cfg) / "manifest.json"
        seen.append(json.loads(path.read_text()) if path.exists() else {})
        return "Thought: look.\nAction: inventory"

    evaluate(cfg, ScriptedBackend(policy))
    first_turn, second_episode = seen
    assert first_turn == {}      # nothing played yet, nothing recorded
    assert second_episode["machines"] == [machine()] and second_episode["finished"] is None
    assert list(second_episode["items"]) == ["3"]
    done = json.loads((paths.eval_dir(cfg) / "manifest.json").read_text())
    assert done["finished"] and list(done["items"]) == ["3", "7"]


def test_compare_warns_in_one_line_of_a_run_made_on_another_machine(tmp_path, textcraft_server):
    eval_run(tmp_path, textcraft_server, "--limit", 1, MODEL_TYPE="here")
    eval_run(tmp_path, textcraft_server, "--limit", 1, MODEL_TYPE="there")
    runs = [tmp_path / "out" / "textcraft" / f"textcraft-tiny_{t}" for t in ("here", "there")]

    def compare() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "eval.py"), "--compare", *map(str, runs)], cwd=tmp_path,
                              env=script_env({}), capture_output=True, text=True, timeout=120)

    same = compare()
    assert same.returncode == 0 and "warning" not in same.stderr
    moved = summary(runs[1])
    moved["provenance"]["machines"] = ["Another CPU, 2 CPU cores"]
    moved["provenance"]["dtype"] = "float32" if moved["provenance"]["dtype"] != "float32" else "bfloat16"
    (runs[1] / "summary.json").write_text(json.dumps(moved))
    warned = compare()
    lines = [line for line in warned.stderr.splitlines() if "warning" in line]
    assert warned.returncode == 0 and len(lines) == 1
    assert "textcraft-tiny_there" in lines[0] and "machines" in lines[0] and "dtype" in lines[0]
    assert "Another CPU" in lines[0]


def episode(turns: list[tuple[str, str]], success: bool) -> dict:
    state = conv.initial_conversation("instr", "Goal: craft stick.")
    for action_text, reply in turns:
        state = conv.append_turn(state, action_text, reply)
    return {"state": state, "success": success, "env_score": float(success)}


SENTENCE = f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait"
BARE = "Thought: hmm.\nAction: wait"
GET = "Thought: go.\nAction: get 1 stick"


def test_revision_turns_are_counted_by_kind_and_refusals_per_episode():
    results = [
        episode([(SENTENCE, "Could not execute wait"), (GET, "Got 1 stick")], True),
        episode([(BARE, "Could not execute wait"), (GET, "Could not find stick")], False),
        episode([(SENTENCE, "ok."), (BARE, "ok.")] + [(SENTENCE, "ok.")] * 8, False),
        episode([(GET, "Got 1 stick")], True),
    ]
    got = revision_turn_counts(results, "textcraft")
    assert got["sentence"] == {"episodes": 2, "succeeded": 1, "turns": 10}
    assert got["bare_wait"] == {"episodes": 2, "succeeded": 0, "turns": 2}
    assert got["episodes"] == 3 and got["turns"] == 12 and got["ten_or_more"] == 1
    refused = refused_action_counts(results, "textcraft")
    assert refused["refused"] == 3 and refused["of_revision_waits"] == 2
    assert refused["per_episode"] == {"0": 2, "1": 1, "2": 1} and refused["mean"] == 0.75
