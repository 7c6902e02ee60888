"""SIGKILL at known points, then one rerun. Each script is held by a gate
(tests/support/faults.py ``Gate``) either at a model call after some outputs
exist, or in the middle of writing an output - its temp file complete, the
rename not yet done - and killed there. Whatever the kill left is whole
(equal to the uninterrupted output); a kill mid-write leaves the target
absent, never partial; after the rerun the outputs equal the uninterrupted
run's, with no duplicate JSONL rows. No sleeps: the kill lands where the test
says, on any machine."""
from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.support import tree_fixtures as tf
from tests.support.faults import GATED, SEARCH_INNER, TABLE_INNER, Gate, files, kill, run_script

RESULT = r"^search_results_\d+\.json$"


class Case:
    """One script: how to run it into a folder, which files are its outputs,
    and where to hold it for each kill point."""

    def __init__(self, script: str, args, env: dict, folder: str, pattern: str, inner: str, points: dict):
        self.script, self.args, self.env, self.folder, self.pattern = script, args, env, folder, pattern
        self.inner, self.points = inner, points

    def argv(self, out: Path) -> list:
        return [self.script, *self.args(out)]

    def outputs(self, out: Path) -> dict[str, bytes]:
        return files(out / self.folder, self.pattern)

    def run_env(self, gate: Gate, out: Path, point: str | None) -> dict:
        where = self.points[point](out / self.folder) if point else {}
        return {**self.env, **gate.env(self.inner, **where)}


def make_case(kind: str, tmp: Path, server: str) -> Case:
    """The run of ``kind`` (mcts, eval or path) and its kill points."""
    if kind == "mcts":
        return Case("mcts_collection.py",
                    lambda out: ["--env_server_base", server, "--backend", GATED, "--model_name", "m",
                                 "--min", "0", "--max", "20", "--concurrency", "3", "--output_dir", out],
                    {"TASK": "textcraft", "MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3"},
                    "textcraft/m", "search_results_*.json", SEARCH_INNER,
                    {"model call": lambda d: {"files": (d / "search_results_*.json", 2)},
                     "mid-write": lambda d: {"write": (RESULT, 3)}})
    if kind == "eval":
        table = tmp / "policy.json"
        table.write_text(json.dumps({"Inventory: You are not": ["Thought: t\nAction: get 1 stick"],
                                     "default": ["Thought: t\nAction: inventory"]}))
        return Case("eval.py",
                    lambda out: ["--env_server_base", server, "--backend", GATED, "--limit", "6",
                                 "--max_steps", "8", "--concurrency", "2", "--output_dir", out],
                    {"TASK": "textcraft", "MODEL_DIR": table, "MODEL_NAME": "t"},
                    "textcraft/t_eval", "search_results_*.json", TABLE_INNER,
                    {"model call": lambda d: {"files": (d / "search_results_*.json", 2)},
                     "mid-write": lambda d: {"write": (RESULT, 3)}})
    trees = tmp / "trees"
    for idx in range(1, 13):
        tf.write_tree(tf.tree_many_leaves() if idx % 3 else tf.tree_shared_prefix(), trees, idx)
    table = tmp / "verifier.json"
    table.write_text(json.dumps({"(step 2)": ["Wasted move.\nJudgment: Bad"], "default": ["Fine.\nJudgment: Good"]}))
    return Case("path_collection.py",
                lambda out: ["--input_dir", trees, "--output_dir", out, "--revise", "1", "--tree_batch", "1",
                             "--backend", GATED],
                {"TASK": "textcraft", "MODEL_DIR": table},
                ".", "*.jsonl", TABLE_INNER,
                {"model call": lambda d: {"call": 4},                       # 3 trees' parts are saved
                 "mid-write": lambda d: {"write": (r"^textcraft_centric\.jsonl$", 1)}})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, textcraft_server):
    """Per script: (case, uninterrupted outputs, its folder), made once."""
    made = {}

    def get(kind: str):
        if kind not in made:
            tmp = tmp_path_factory.mktemp(kind)
            case = make_case(kind, tmp, textcraft_server)
            res = run_script(*case.argv(tmp / "ref"), env=case.run_env(Gate(tmp / "ref_gate"), tmp / "ref", None))
            assert res.returncode == 0, res.stderr[-3000:]
            made[kind] = (case, case.outputs(tmp / "ref"), tmp)
        return made[kind]

    return get


@pytest.mark.parametrize("point", ["model call", "mid-write"])
@pytest.mark.parametrize("kind", ["mcts", "eval", "path"])
def test_sigkill_then_rerun_equals_uninterrupted(kind, point, reference):
    """Killed at a model call or between a temp file and its rename, each
    script leaves only whole outputs (never a partial target); one rerun
    completes them to the uninterrupted run's bytes, no JSONL row twice."""
    case, expected, tmp = reference(kind)
    assert expected
    out = tmp / f"killed_{point.replace(' ', '_')}"
    gate = Gate(tmp / f"gate_{point.replace(' ', '_')}")
    proc = run_script(*case.argv(out), env=case.run_env(gate, out, point), wait=False)
    reached = gate.wait(proc)
    at_gate = case.outputs(out)
    if point == "mid-write":
        src, dst = map(Path, re.fullmatch(r"write (.+) -> (.+)", reached).groups())
        assert src.exists() and src.read_bytes() == expected[dst.name]   # the temp file is complete ...
        assert not dst.exists()                                           # ... and not yet renamed
    kill(proc, signal.SIGKILL)
    proc.communicate()

    assert case.outputs(out) == at_gate               # the kill landed where the gate held the run
    for name, data in at_gate.items():                # what the kill left is whole
        assert data == expected[name], f"{name} is partial"
    if point == "mid-write":
        assert not dst.exists() and src.exists()      # killed between temp file and rename: no partial target
    elif kind == "path":                               # the JSONL comes last; 3 trees' parts were saved
        assert not at_gate and len(list((out / ".parts" / "textcraft_centric").glob("*.json"))) == 3
    else:
        assert 0 < len(at_gate) < len(expected)

    rerun = run_script(*case.argv(out), env=case.run_env(Gate(tmp / f"rerun_{point.replace(' ', '_')}"), out, None))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert case.outputs(out) == expected
    for name, data in case.outputs(out).items():
        if name.endswith(".jsonl"):
            lines = data.splitlines()
            assert len(lines) == len(set(lines)), f"duplicate rows in {name}"
