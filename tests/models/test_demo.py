"""The one-command demo (scripts/demo.sh: one short iterate.py iteration), shortened:
two train tasks, a short search and three test tasks. Real server process, real
self-training base model models/textcraft-base (hf). And, in seconds, what the
script hands iterate.py: that base model, and search tasks it was never taught."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r.loop.search_tasks import taught_tasks
from agent_r.paths import find_tree_files, tree_index
from agent_r.splits import load_split_file
from scripts.demo_summary import summarize

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "models" / "textcraft-base"
DEMO_VARS = ("MODEL_DIR", "MODEL_NAME", "TASK", "TEMP", "DEMO_MIN", "DEMO_MAX", "DEMO_SEARCH_TASKS")
# Stands in for the Python the demo runs: iterate.py only records what it was
# given, the summary and the viewer do nothing (there is no run to read), the
# rest (the server, the task picker) is the real thing.
RECORDING_PY = """#!/usr/bin/env bash
case "$1" in
  iterate.py) {{ echo "MODEL_DIR=$MODEL_DIR"; printf '%s\\n' "$@"; }} > "$DEMO_OUT/iterate_call"; exit 0 ;;
  -m) case "$2" in scripts.demo_summary|agent_r.view) exit 0 ;; esac ;;
esac
exec {python} "$@"
"""


def without_demo_vars() -> dict[str, str]:
    """This process's environment without the variables the demo reads."""
    return {k: v for k, v in os.environ.items() if k not in DEMO_VARS}


def demo_call(tmp_path: Path, **env: str) -> list[str]:
    """Run scripts/demo.sh with the recording Python: the lines iterate.py got
    (MODEL_DIR=..., then its arguments)."""
    py = tmp_path / "py"
    py.write_text(RECORDING_PY.format(python=sys.executable))
    py.chmod(0o755)
    full = dict(without_demo_vars(), PY=str(py), SKIP_SETUP="1", DEMO_OUT=str(tmp_path / "out"), LOGLEVEL="WARNING")
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env={**full, **env}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (tmp_path / "out" / "iterate_call").read_text().splitlines()


def test_the_demo_runs_the_base_model_on_train_tasks_it_was_never_taught(tmp_path):
    call = demo_call(tmp_path)
    assert call[0] == "MODEL_DIR=models/textcraft-base" and "--min" not in call and "--max" not in call
    task_list = Path(call[call.index("--split_file") + 1])
    chosen = load_split_file(str(task_list))
    env, taught = taught_tasks(BASE)
    assert env == "textcraft" and len(chosen) == 10 and not set(chosen) & taught
    assert len(taught) == 148                       # a third of the 444 train tasks, so most are unseen


@pytest.mark.parametrize("demo_env, flags", [({"DEMO_MIN": "0", "DEMO_MAX": "10"}, ["--min", "0", "--max", "10"]),
                                             ({"DEMO_MAX": "7"}, ["--min", "0", "--max", "7"])])
def test_demo_min_and_max_still_choose_a_range(tmp_path, demo_env, flags):
    """The range is handed on as is: the loop itself leaves the taught tasks out."""
    call = demo_call(tmp_path, **demo_env, MODEL_DIR="/some/model")
    assert call[0] == "MODEL_DIR=/some/model" and "--split_file" not in call
    i = call.index("--min")
    assert call[i:i + 4] == flags


def test_demo_makes_trees_revision_data_and_a_score(tmp_path):
    """scripts/demo.sh exits 0 with trees, revision samples, an XTuner export
    with both loss flags, scores of both iterations, results.md/png, a viewer
    page per tree, and the server stopped by its trap."""
    # train tasks 91-93: 91 was taught to the base model (the loop leaves it out), 93
    # is one it solves in a short search
    env = dict(without_demo_vars(), PY=sys.executable, SKIP_SETUP="1", DEMO_OUT=str(tmp_path / "demo"),
               DEMO_MIN="91", DEMO_MAX="94", ITERA="3", N_GEN="4", DEMO_EVAL_LIMIT="3",
               BACKEND="hf", LOGLEVEL="WARNING")
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "demo" / "demo"          # iterate.py --runs_dir DEMO_OUT --name demo
    s = summarize(run)
    assert s["trees"] == 2
    searched = {tree_index(p) for p in find_tree_files(run / "iter_1" / "trees")}
    assert searched == {92, 93} and 91 in taught_tasks(BASE)[1] and not searched & taught_tasks(BASE)[1]
    left_out = json.loads((run / "results.json").read_text())["search_tasks"]["textcraft"]
    assert (left_out["chosen"], left_out["taught_left_out"], left_out["searched"]) == (3, 1, 2)
    assert s["successful_leaves"] >= 1
    assert s["revision_samples"] >= 1 and s["xtuner_samples"] >= s["revision_samples"]
    assert {(it, n) for it, _variant, _task, n, _success, _score in s["scores"]} == {(0, 3), (1, 3)}
    assert "revision samples:" in proc.stdout and "score x100" in proc.stdout
    assert (run / "results.md").exists() and (run / "results.png").exists()
    # viewer pages of the searched trees, one per tree, revision pairs matched to them
    pages = list((run / "viewer").rglob("search_results_*.html"))
    assert (run / "viewer" / "index.html").exists() and len(pages) == s["trees"]
    assert f"{run}/viewer/index.html" in proc.stdout and "revision pairs shown:" in proc.stdout
    # the exported samples carry explicit loss flags, the bad prefix untrained
    rows = json.loads(next((run / "iter_1" / "data").glob("*/train.json")).read_text())
    flags = [m["loss"] for r in rows for m in r["messages"] if m["role"] == "assistant" and "loss" in m]
    assert True in flags and False in flags
    # the server was stopped by the trap
    assert "textcraft server on" in (tmp_path / "demo" / "textcraft_server.log").read_text()
