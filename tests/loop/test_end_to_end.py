"""The self-training loop end to end (search, revision data, export,
fine-tuning, eval) on the real local TextCraft (and SciWorld) servers with a
tiny random Llama that really is fine-tuned and saved each iteration: every
variant's rows and files after two iterations, a run killed mid-stage and rerun
equals an undisturbed one, and several tasks pool their data into one model.
The policy is tests/loop/doubles.py's ``weights_double``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig
from agent_r.loop import run
from tests.loop.conftest import FLAGS, ROOT, SMALL, comparable, settings_for
from tests.loop.doubles import GATE


@pytest.fixture(scope="module")
def undisturbed(small_env, textcraft_server, tmp_path_factory) -> Path:
    """Two iterations of all three variants, run in-process through the library."""
    runs = tmp_path_factory.mktemp("runs")
    result = run(settings_for(small_env, FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(runs),
                                                  "--name", "plain"]))
    assert result.exit_code == 0, result.incomplete
    return result.root


# --------------------------------------------------------------------------- the loop

def test_two_iterations_end_to_end(undisturbed):
    results = json.loads((undisturbed / "results.json").read_text())
    rows = results["rows"]
    assert [(r["iteration"], r["variant"]) for r in rows] == [
        (0, "base"), (1, "agent-r"), (1, "direct"), (1, "good"), (2, "agent-r"), (2, "direct"), (2, "good")]
    assert (undisturbed / "results.png").stat().st_size > 1000
    with Image.open(undisturbed / "losses.png") as image:   # every fine-tune's loss per optimizer step
        curves = json.loads(image.text["Description"])
    assert sorted(curves) == ["iteration 1", "iteration 2"]
    assert all(len(curves[f"iteration {r['iteration']}"][r["variant"]]) == r["train"]["steps"] for r in rows[1:])
    md = (undisturbed / "results.md").read_text()
    assert "| 2 | agent-r |" in md and "textcraft success %" in md
    # iteration 1 of every variant starts from the base model's one search
    assert sorted(p.name for p in (undisturbed / "iter_1" / "trees").iterdir()) == ["base"]
    assert sorted(p.name for p in (undisturbed / "iter_2" / "trees").iterdir()) == ["agent-r", "direct", "good"]
    by = {(r["iteration"], r["variant"]): r for r in rows}
    for v in ("agent-r", "direct", "good"):
        one, two = by[(1, v)], by[(2, v)]
        assert one["model"] == f"iter_1/model/{v}/hf" and two["started_from"] == one["model"]
        assert one["train"]["trainer"] == "cpu" and one["train"]["steps"] > 0
        assert one["test"]["textcraft"]["tasks"] == 3 and one["revise_task"]["textcraft"]["tasks"] >= 1
        assert one["search"]["textcraft"]["trees"] == 4   # train tasks 1-4 (5 is a test task)
    data = {v: by[(1, v)]["data"]["tasks"]["textcraft"] for v in ("agent-r", "direct", "good")}
    assert data["agent-r"]["revision_samples"] > 0 and data["good"]["revision_samples"] == 0
    assert data["agent-r"]["good_samples"] == data["good"]["good_samples"] > 0   # same trees
    assert data["agent-r"]["mean_first_bad_step"] is not None and data["direct"]["mean_first_bad_step"] is None
    assert by[(1, "good")]["data"]["train_samples"] == data["good"]["good_samples"]
    # the trained model is a Hugging Face directory the hf backend loads and runs
    backend = HFBackend(str(undisturbed / "iter_2" / "model" / "agent-r" / "hf"), device="cpu")
    try:
        msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Goal: craft stick."}]
        out = backend.generate([GenerationRequest(msgs, n=1)], SamplingConfig(temperature=0.0, max_new_tokens=8))
        assert len(out) == 1 and isinstance(out[0][0], str)
    finally:
        backend.close()


def _cli(env: dict[str, str], args: list[str]) -> subprocess.Popen:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "OMP_NUM_THREADS", "TMPDIR")}
    return subprocess.Popen([sys.executable, str(ROOT / "iterate.py"), *args], cwd=ROOT,
                            env={**keep, "PYTHONPATH": str(ROOT), "LOGLEVEL": "WARNING", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_run_killed_mid_stage_and_rerun_equals_the_undisturbed_run(undisturbed, small_env, textcraft_server,
                                                                      tmp_path):
    args = FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(tmp_path), "--name", "killed"]
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = _cli({**small_env, GATE: str(gate)}, args)
    try:
        deadline = time.monotonic() + 600
        while not (gate / "reached").exists():   # the double holds the run inside iteration 2's search
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never reached the gate"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    root = tmp_path / "killed"
    assert not (root / "iter_2" / "trees" / "agent-r" / ".done.json").exists()
    assert list((root / "iter_2" / "trees" / "agent-r").glob("*/*/search_results_*.json"))  # some trees kept
    finished = {p: p.stat().st_mtime_ns for p in (root / "iter_1").rglob(".done.json")}
    out, err = _cli(small_env, args).communicate(timeout=900)
    assert "results:" in out, err[-3000:]
    assert {p: p.stat().st_mtime_ns for p in finished} == finished   # finished stages were not redone
    got = json.loads((root / "results.json").read_text())["rows"]
    want = json.loads((undisturbed / "results.json").read_text())["rows"]
    assert comparable(got) == comparable(want)


def test_multi_task_pools_data_trains_one_model_and_scores_each_task(base_model, textcraft_server, sciworld_server,
                                                                      tmp_path):
    env = {**SMALL, "TASK": "textcraft,sciworld", "MODEL_DIR": base_model, "ITERATIONS": "1",
           "VARIANTS": "agent-r", "MAX_DEPTH": "3"}
    s = settings_for(env, FLAGS + ["--env_server_base", f"{textcraft_server},{sciworld_server}", "--runs_dir",
                                   str(tmp_path), "--name", "multi", "--max", "3", "--task_iteration", "1",
                                   "--eval_limit", "2", "--eval_max_steps", "2", "--revise_limit", "1"])
    result = run(s)
    assert result.exit_code == 0, result.incomplete
    rows = result.rows
    assert [r["variant"] for r in rows] == ["base", "agent-r"]
    for r in rows:
        assert set(r["test"]) == {"textcraft", "sciworld"} and r["test"]["sciworld"]["tasks"] == 2
    one = rows[1]
    assert set(one["search"]) == {"textcraft", "sciworld"} and one["search"]["sciworld"]["trees"] >= 1
    assert one["data"]["train_samples"] >= one["data"]["tasks"]["textcraft"]["revision_samples"] > 0
    assert list((tmp_path / "multi" / "iter_1" / "model").iterdir()) == [tmp_path / "multi" / "iter_1" / "model" / "agent-r"]
    header = result.table.splitlines()[4]
    assert "textcraft success %" in header and "sciworld success %" in header and "average" in header
