"""eval.py as a user runs it: a subprocess against the real local TextCraft
server, with the tiny real model (hf backend) or the scripted table double."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_r.envs import get_env

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = ("tasks", "score_x100", "success_rate", "mean_steps", "step_limit", "disaster", "failed", "loops")


def run_eval(args, env=None, wait=True, **popen):
    full_env = {**os.environ, "LOGLEVEL": "WARNING", **(env or {})}
    cmd = [sys.executable, str(ROOT / "eval.py"), *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300, **popen)


def test_tiny_model_hf_backend_end_to_end(tmp_path, tiny_model_dir, textcraft_server):
    out = tmp_path / "out"
    proc = run_eval(["--env_server_base", textcraft_server, "--backend", "hf", "--limit", "3",
                     "--max_steps", "2", "--max_new_tokens", "16", "--output_dir", str(out), "--concurrency", "3"],
                    env={"TASK": "textcraft", "MODEL_DIR": tiny_model_dir, "MODEL_NAME": "tiny", "TEMP": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = out / "textcraft" / "tiny_eval"
    expected = get_env("textcraft").split_indices("test")[:3]
    files = sorted(run_dir.glob("search_results_*.json"))
    assert sorted(int(p.stem.rsplit("_", 1)[1]) for p in files) == sorted(expected)
    results = [json.loads(p.read_text()) for p in files]
    for r in results:
        assert r["model_name"] == "tiny" and r["task_id"] in expected
        assert 1 <= r["step_num"] <= 2 and len(r["state"]) == 4 + 2 * r["step_num"]
        assert r["ended_by"] in ("done", "step_limit", "disaster")
        assert r["state"][3]["content"].startswith("Crafting commands:")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"] == 3
    assert summary["mean_steps"] == pytest.approx(sum(r["step_num"] for r in results) / 3)
    assert summary["score_x100"] == pytest.approx(100 * sum(r["env_score"] for r in results) / 3)
    assert summary["step_limit"] == sum(r["ended_by"] == "step_limit" for r in results)
    # batched: one generate call per round for all live episodes, not one per task
    assert summary["backend_stats"]["calls"] == max(r["model_steps"] for r in results)
    assert summary["backend_stats"]["requests"] == sum(r["model_steps"] for r in results)
    assert "score x100" in proc.stdout and "tiny_eval" in proc.stdout


def test_killed_run_resumes_to_the_same_summary(tmp_path, textcraft_server):
    """SIGKILL after the first result lands; the rerun completes only the
    missing tasks and reports what an uninterrupted run reports."""
    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"Inventory: You are not": ["Thought: t\nAction: get 1 stick"],
                                 "default": ["Thought: t\nAction: inventory"]}))
    env = {"TASK": "textcraft", "MODEL_DIR": str(table), "MODEL_NAME": "table", "TEMP": "0",
           "LATENCY_PER_CALL": "0.02", "LATENCY_PER_TOKEN": "0"}
    common = ["--env_server_base", textcraft_server, "--backend", "python:tests.support.doubles:latency_table_backend",
              "--limit", "5", "--max_steps", "12", "--concurrency", "1"]

    killed_out = tmp_path / "killed"
    run_dir = killed_out / "textcraft" / "table_eval"
    proc = run_eval(common + ["--output_dir", str(killed_out)], env=env, wait=False)
    deadline = time.monotonic() + 120
    while not list(run_dir.glob("search_results_*.json")):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.name: p.stat().st_mtime_ns for p in run_dir.glob("search_results_*.json")}
    assert 1 <= len(done_before) < 5

    resumed = run_eval(common + ["--output_dir", str(killed_out)], env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = {p.name: p.stat().st_mtime_ns for p in run_dir.glob("search_results_*.json")}
    assert len(after) == 5
    assert all(after[name] == stamp for name, stamp in done_before.items())  # finished tasks untouched
    resumed_summary = json.loads((run_dir / "summary.json").read_text())
    assert resumed_summary["backend_stats"]["requests"] == 12 * (5 - len(done_before))

    clean_out = tmp_path / "clean"
    clean = run_eval(common + ["--output_dir", str(clean_out)], env=env)
    assert clean.returncode == 0, clean.stderr[-3000:]
    clean_summary = json.loads((clean_out / "textcraft" / "table_eval" / "summary.json").read_text())
    assert {k: resumed_summary[k] for k in SUMMARY_KEYS} == {k: clean_summary[k] for k in SUMMARY_KEYS}
    assert clean_summary["step_limit"] == 5 and clean_summary["loops"]["2"]["count"] == 5 * 9
    for name in after:
        a = json.loads((run_dir / name).read_text())
        b = json.loads((clean_out / "textcraft" / "table_eval" / name).read_text())
        assert a == b

    # --compare prints both runs side by side without running anything
    cmp = run_eval(["--compare", str(run_dir), str(clean_out / "textcraft" / "table_eval")], env={"TASK": ""})
    assert cmp.returncode == 0, cmp.stderr
    score_row = next(line for line in cmp.stdout.splitlines() if line.startswith("score x100"))
    assert score_row.split()[-2:] == ["0.00", "0.00"]


@pytest.mark.parametrize("env,args,message", [
    ({"TASK": "minecraft"}, [], "unknown TASK='minecraft'"),
    ({"TASK": "textcraft"}, ["--split_file", "/nonexistent/split.json"], "split file /nonexistent/split.json does not exist"),
    ({"TASK": "webshop"}, ["--split", "project"], "--split='project' is not a webshop split"),
    ({"TASK": "textcraft"}, ["--max_steps", "0"], "--max_steps=0 is too small"),
    ({"TASK": "textcraft"}, ["--limit", "0"], "--limit=0 is too small"),
    ({"TASK": "textcraft", "TEMP": "hot"}, [], "TEMP='hot' is not a number"),
    ({"TASK": "textcraft", "MAX_TOKEN_LENGTH": "99"}, [], "MAX_TOKEN_LENGTH=99 is too small"),
    ({"TASK": ""}, [], "environment variable TASK is not set"),
])
def test_bad_input_is_one_line_exit_2(env, args, message):
    proc = run_eval(args, env={"MODEL_DIR": "/nonexistent-model", **env})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_unreachable_server_is_one_line_exit_2(tmp_path):
    from tests.support.env_fixtures import free_port

    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"default": ["Action: inventory"]}))
    proc = run_eval(["--env_server_base", f"http://127.0.0.1:{free_port()}", "--limit", "1",
                     "--backend", "python:tests.support.doubles:table_backend", "--output_dir", str(tmp_path)],
                    env={"TASK": "textcraft", "MODEL_DIR": str(table)})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "127.0.0.1" in lines[0], proc.stderr


def test_an_episode_that_fails_for_good_exits_1_and_is_retried(tmp_path, textcraft_server):
    """The real server rejects task -1 (a negative index) on every reset: that
    episode is restarted, recorded with ended_by "error", the others finish,
    and the run exits 1; a rerun retries only the failed one."""
    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"default": ["Action: inventory"]}))
    split = tmp_path / "split.json"
    split.write_text(json.dumps([{"item_id": "textcraft_0"}, -1, {"item_id": "textcraft_4"}]))
    args = ["--env_server_base", textcraft_server, "--backend", "python:tests.support.doubles:table_backend",
            "--split_file", str(split), "--max_steps", "2", "--output_dir", str(tmp_path / "out"),
            "--env_retries", "1", "--env_retry_delay", "0"]
    env = {"TASK": "textcraft", "MODEL_DIR": str(table), "MODEL_NAME": "t"}
    proc = run_eval(args, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "textcraft" / "t_eval"
    failed = json.loads((run_dir / "search_results_-1.json").read_text())
    assert failed["ended_by"] == "error" and "data_idx must be >= 0" in failed["error"]
    assert failed["env_score"] == 0.0 and failed["success"] is False
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["tasks"], summary["failed"], summary["step_limit"]) == (3, 1, 2)
    assert "1 of 3 episodes failed" in proc.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["items"]["-1"]["env_restarts"] == 1 and manifest["finished"] is not None

    stamp = (run_dir / "search_results_0.json").stat().st_mtime_ns
    again = run_eval(args, env=env)
    assert again.returncode == 1 and "1 of 1 episodes failed" in again.stdout
    assert (run_dir / "search_results_0.json").stat().st_mtime_ns == stamp
    assert json.loads((run_dir / "summary.json").read_text())["backend_stats"]["requests"] == 0


def test_help_lists_every_setting():
    from agent_r.evaluation import EvalSettings
    from agent_r.settings import BackendSettings
    from dataclasses import fields

    proc = run_eval(["--help"])
    assert proc.returncode == 0
    for cls in (EvalSettings, BackendSettings):
        for f in fields(cls):
            if f.metadata.get("nested"):
                continue
            flag = f.metadata["flag"]
            names = [f"--{f.name}" if flag is True else flag, f.metadata["env"]]
            assert any(n and n in proc.stdout for n in names), f.name
    for name in ("TASK", "MODEL_TYPE", "TEMP", "MAX_TOKEN_LENGTH", "MODEL_DIR", "MODEL_NAME", "BACKEND",
                 "--env_server_base", "--model_name", "--max_steps", "--split_file", "--output_dir", "--concurrency",
                 "--seed", "--backend", "--max_new_tokens", "--limit", "--compare", "--revise_from",
                 "--env_retries", "--env_retry_delay"):
        assert name in proc.stdout, name
