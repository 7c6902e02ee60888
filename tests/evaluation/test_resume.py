"""Interrupted and failing eval runs: a rerun plays only the tasks without a
complete result file (a torn one is redone, finished ones untouched) and
reports what an uninterrupted run reports; env errors restart an episode on
a fresh client, and one that keeps failing is recorded (ended_by "error",
exit 1) and retried by the next run. The model is made only when an episode
remains, and only after the env server answered."""
import json
import signal
import time

import pytest

from agent_r import evaluation as ev
from agent_r import paths, report
from agent_r.envs import get_env
from agent_r.io import file_sha256
from agent_r.knobs import BackendSettings
from tests.support.doubles import ScriptedBackend
from tests.support.eval_runs import config, model_turns, read_results, run_eval, split_file


def test_resume_skips_done_and_redoes_corrupt(tmp_path, textcraft_server):
    split = split_file(tmp_path, [0, 1, 2])
    cfg = config(tmp_path, textcraft_server, split, max_steps=2)
    first = ev.evaluate(cfg, ScriptedBackend(lambda m, i, s: "Action: inventory")).summary
    run_dir = paths.eval_dir(cfg)
    (run_dir / "search_results_1.json").write_text('{"task_id": 1, "env_sc')  # a torn write from elsewhere
    stamp = (run_dir / "search_results_0.json").stat().st_mtime_ns
    again = ScriptedBackend(lambda m, i, s: "Action: inventory")
    second_run = ev.evaluate(cfg, again)
    second = second_run.summary
    assert again.stats.requests == 2  # only task 1, two steps
    assert (second_run.ran, second_run.skipped) == (1, 2)
    assert (run_dir / "search_results_0.json").stat().st_mtime_ns == stamp
    assert json.loads((run_dir / "search_results_1.json").read_text())["step_num"] == 2
    keys = ("tasks", "score_x100", "success_rate", "mean_steps", "step_limit", "failed", "loops")
    assert {k: first[k] for k in keys} == {k: second[k] for k in keys}


class FlakyClientDouble:
    """Test double around a real env client: ``step(fail_action)`` (or
    ``reset(fail_reset)``) raises a server error the first ``fail_times`` times,
    counted across clients (simulates server hiccups, which the real server
    cannot produce on demand)."""

    failures: dict = {}

    def __init__(self, real, fail_times, fail_action=None, fail_reset=None):
        self.real, self.fail_times, self.fail_action, self.fail_reset = real, fail_times, fail_action, fail_reset

    def __getattr__(self, name):
        return getattr(self.real, name)

    def _maybe_fail(self, what):
        n = FlakyClientDouble.failures.get(what, 0)
        if n < self.fail_times:
            FlakyClientDouble.failures[what] = n + 1
            from agentenv_client import EnvServerError

            raise EnvServerError(f"simulated failure {n + 1} of {what}")

    def reset(self, idx):
        if idx == self.fail_reset:
            self._maybe_fail(("reset", idx))
        return self.real.reset(idx)

    def step(self, action):
        if action == self.fail_action:
            self._maybe_fail(("step", action))
        return self.real.step(action)


@pytest.mark.parametrize("fail_times,ended_by", [(1, "step_limit"), (5, "error")])
def test_env_errors_are_retried_then_recorded(tmp_path, textcraft_server, fail_times, ended_by):
    FlakyClientDouble.failures = {}
    rules = get_env("textcraft")
    seq = ["inventory", "get 1 boom", "inventory"]
    policy = lambda m, i, s: f"Action: {seq[model_turns(m) % 3]}"  # noqa: E731
    new_client = lambda: FlakyClientDouble(rules.make_client(textcraft_server), fail_times, fail_action="get 1 boom")  # noqa: E731
    cfg = config(tmp_path, textcraft_server, split_file(tmp_path, [0, 4]), max_steps=3, env_retries=2)
    done = ev.evaluate(cfg, ScriptedBackend(policy), new_client=new_client)
    summary = done.summary
    res = read_results(cfg)
    ended = sorted(r["ended_by"] for r in res.values())
    if ended_by == "error":
        # both episodes hit the failing action; 5 failures: one episode spends 3 (1 try + 2 retries)
        # and is recorded as failed, the other recovers
        assert ended == ["error", "step_limit"] and summary["failed"] == 1
        assert (done.failed, done.exit_code) == (1, 1)
        manifest = json.loads((paths.eval_dir(cfg) / "manifest.json").read_text())
        assert [item["env_restarts"] for item in manifest["items"].values()] == [2, 2]  # in lockstep
        err = next(r for r in res.values() if r["ended_by"] == "error")
        assert "simulated failure" in err["error"] and err["env_score"] == 0.0
        # errors are redone by a rerun (they may have been transient)
        FlakyClientDouble.failures = {("step", "get 1 boom"): 99}
        again = ev.evaluate(cfg, ScriptedBackend(policy), new_client=new_client)
        assert again.summary["failed"] == 0 and again.summary["tasks"] == 2
        assert (again.ran, again.failed, again.exit_code) == (1, 0, 0)
    else:
        # the failed episode restarted from its reset and produced a clean trajectory
        assert ended == ["step_limit", "step_limit"] and summary["failed"] == 0 and done.exit_code == 0
        for r in res.values():
            assert report.episode_actions(r["state"]) == seq


def test_failed_reset_is_retried_before_any_model_call(tmp_path, textcraft_server):
    FlakyClientDouble.failures = {}
    rules = get_env("textcraft")
    new_client = lambda: FlakyClientDouble(rules.make_client(textcraft_server), 2, fail_reset=4)  # noqa: E731
    seen = []

    def policy(messages, i, seed):
        seen.append(messages)
        return "Action: inventory"

    cfg = config(tmp_path, textcraft_server, split_file(tmp_path, [0, 4]), max_steps=2, env_retries=2)
    backend = ScriptedBackend(policy)
    summary = ev.evaluate(cfg, backend, new_client=new_client).summary
    assert FlakyClientDouble.failures == {("reset", 4): 2}
    assert summary["failed"] == 0 and summary["step_limit"] == 2
    assert backend.batch_sizes == [2, 2]          # the failing start never reached the model
    assert all(len(m) >= 4 and m[3]["content"].startswith("Crafting commands:") for m in seen)


SUMMARY_KEYS = ("tasks", "score_x100", "success_rate", "mean_steps", "step_limit", "disaster", "failed", "loops")


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


def test_the_model_loads_only_when_an_episode_remains_and_after_the_server_answers(tmp_path, textcraft_server):
    """The backend here cannot load (its policy table is missing). A rerun
    whose results are all complete never makes it and exits 0; an unreachable
    server is reported before any model is made; with work left the model's
    own error is the run's one line."""
    from tests.support.env_fixtures import free_port

    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"default": ["Action: inventory"]}))
    args = ["--backend", "python:tests.support.doubles:table_backend", "--max_steps", "1",
            "--output_dir", str(tmp_path / "out")]
    env = {"TASK": "textcraft", "MODEL_DIR": str(table), "MODEL_NAME": "t"}
    first = run_eval(["--env_server_base", textcraft_server, "--limit", "2", *args], env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    broken = {**env, "MODEL_DIR": str(tmp_path / "missing.json")}
    done = run_eval(["--env_server_base", textcraft_server, "--limit", "2", *args], env=broken)
    assert done.returncode == 0, done.stderr[-3000:]
    unreachable = run_eval(["--env_server_base", f"http://127.0.0.1:{free_port()}", "--limit", "3", *args], env=broken)
    lines = [line for line in unreachable.stderr.splitlines() if line.strip()]
    assert unreachable.returncode == 2 and len(lines) == 1 and "127.0.0.1" in lines[0] and "policy" not in lines[0]
    more = run_eval(["--env_server_base", textcraft_server, "--limit", "3", *args], env=broken)
    assert more.returncode == 2 and more.stderr.strip().splitlines()[-1].startswith("error: policy table")


def test_a_resumed_run_with_nothing_left_keeps_the_backend_and_names_the_weights(tmp_path, textcraft_server):
    """A run killed after its last episode ended (its summary unwritten, the
    manifest missing that episode) resumes with no model: the summary still
    says which backend played and which weights, the manifest lists every
    episode (the missing one read back from its file)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    split = split_file(tmp_path, [0, 1, 2])
    cfg = config(tmp_path, textcraft_server, split, max_steps=2,
                 backend=BackendSettings(model_name="scripted", model_dir=str(model)))
    first = ev.evaluate(cfg, ScriptedBackend(lambda m, i, s: "Action: inventory")).summary
    run_dir = paths.eval_dir(cfg)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    del manifest["items"]["1"]                                   # the kill came before the manifest was written
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "summary.json").unlink()

    resumed = ev.evaluate(cfg, None)
    assert resumed.ran == 0
    assert resumed.summary["backend"] == first["backend"] == ScriptedBackend(lambda m, i, s: "").describe()
    assert resumed.summary["model_sha256"] == first["model_sha256"] == file_sha256(model / "model.safetensors")
    items = json.loads((run_dir / "manifest.json").read_text())["items"]
    assert sorted(items) == ["0", "1", "2"]
    assert items["1"] == {"env_score": 0.0, "step_num": 2, "ended_by": "step_limit", "recovered": True}
    assert "recovered" not in items["0"]
