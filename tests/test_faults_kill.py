"""SIGKILL at random points: each script is killed after a seeded random share
of its uninterrupted wall time (start-up, mid-run or while writing), then
rerun once. Whatever the kill left is whole (equal to the uninterrupted
output), and after the rerun the outputs equal the uninterrupted run's, with
no duplicate JSONL rows."""
from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from tests.support import tree_fixtures as tf
from tests.support.faults import LATENCY_TABLE, SEARCH_DOUBLE, files, kill, run_script

SEEDS = (0, 1, 2)


def kill_after(share: float, wall: float, *args, env: dict) -> None:
    proc = run_script(*args, env=env, wait=False)
    time.sleep(share * wall)
    kill(proc, signal.SIGKILL)
    proc.communicate()


def timed(*args, env: dict):
    started = time.monotonic()
    res = run_script(*args, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res, time.monotonic() - started


class Case:
    """One script: how to run it into a folder and which files are its outputs."""

    def __init__(self, script: str, args, env: dict, folder: str, pattern: str):
        self.script, self.args, self.env, self.folder, self.pattern = script, args, env, folder, pattern

    def argv(self, out: Path) -> list:
        return [self.script, *self.args(out)]

    def outputs(self, out: Path) -> dict[str, bytes]:
        return files(out / self.folder, self.pattern)


def make_case(kind: str, tmp: Path, server: str) -> Case:
    if kind == "mcts":
        return Case("mcts_collection.py",
                    lambda out: ["--env_server_base", server, "--backend", SEARCH_DOUBLE, "--model_name", "m",
                                 "--min", "0", "--max", "20", "--concurrency", "3", "--output_dir", out],
                    {"TASK": "textcraft", "MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3", "SEARCH_DOUBLE_SLEEP": "0.03"},
                    "textcraft/m", "search_results_*.json")
    if kind == "eval":
        table = tmp / "policy.json"
        table.write_text(json.dumps({"Inventory: You are not": ["Thought: t\nAction: get 1 stick"],
                                     "default": ["Thought: t\nAction: inventory"]}))
        return Case("eval.py",
                    lambda out: ["--env_server_base", server, "--backend", LATENCY_TABLE, "--limit", "6",
                                 "--max_steps", "8", "--concurrency", "2", "--output_dir", out],
                    {"TASK": "textcraft", "MODEL_DIR": table, "MODEL_NAME": "t", "LATENCY_PER_CALL": "0.03",
                     "LATENCY_PER_TOKEN": "0"},
                    "textcraft/t_eval", "search_results_*.json")
    trees = tmp / "trees"
    for idx in range(1, 13):
        tf.write_tree(tf.tree_many_leaves() if idx % 3 else tf.tree_shared_prefix(), trees, idx)
    table = tmp / "verifier.json"
    table.write_text(json.dumps({"(step 2)": ["Wasted move.\nJudgment: Bad"], "default": ["Fine.\nJudgment: Good"]}))
    return Case("path_collection.py",
                lambda out: ["--input_dir", trees, "--output_dir", out, "--revise", "1", "--tree_batch", "1",
                             "--backend", LATENCY_TABLE],
                {"TASK": "textcraft", "MODEL_DIR": table, "LATENCY_PER_CALL": "0.1", "LATENCY_PER_TOKEN": "0"},
                ".", "*.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, textcraft_server):
    """Per script: (case, uninterrupted outputs, wall seconds), made once."""
    made = {}

    def get(kind: str):
        if kind not in made:
            tmp = tmp_path_factory.mktemp(kind)
            case = make_case(kind, tmp, textcraft_server)
            _, wall = timed(*case.argv(tmp / "ref"), env=case.env)
            made[kind] = (case, case.outputs(tmp / "ref"), wall, tmp)
        return made[kind]

    return get


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["mcts", "eval", "path"])
def test_sigkill_then_rerun_equals_uninterrupted(kind, seed, reference):
    case, expected, wall, tmp = reference(kind)
    assert expected
    out = tmp / f"killed_{seed}"
    kill_after(random.Random(seed).uniform(0.1, 0.9), wall, *case.argv(out), env=case.env)

    for name, data in case.outputs(out).items():   # what the kill left is whole
        assert data == expected[name], f"{name} is partial"

    rerun = run_script(*case.argv(out), env=case.env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert case.outputs(out) == expected
    for name, data in case.outputs(out).items():
        if name.endswith(".jsonl"):
            lines = data.splitlines()
            assert len(lines) == len(set(lines)), f"duplicate rows in {name}"
