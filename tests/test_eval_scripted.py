"""Evaluation episodes against the real local env servers, driven by the
ScriptedBackend test double (hand-computable policies)."""
import json

import pytest

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import report
from agent_r.envs import get_env
from agent_r.settings import BackendSettings
from agentenv_servers.textcraft_expert import solve
from tests.support.doubles import ScriptedBackend

SOLVED, LOOPING = 0, 1  # split positions: the policy solves task 0 and loops on task 1


def split_file(tmp_path, indices, task="textcraft"):
    path = tmp_path / f"split_{'_'.join(map(str, indices))}.json"
    path.write_text(json.dumps([{"item_id": f"{task}_{i}"} for i in indices]))
    return str(path)


def model_turns(messages):
    return sum(1 for m in messages[conv.HEAD_LEN:] if m["role"] == "assistant")


def expert_or_loop(solve_indices_goals):
    """Follows the expert plan when the goal is one of ``solve_indices_goals``,
    else asks for the inventory forever (a loop of period 1)."""

    def policy(messages, i, seed):
        task_obs = messages[conv.HEAD_LEN - 1]["content"]
        plan = solve(task_obs)
        if plan.goal in solve_indices_goals:
            k = model_turns(messages)
            return plan.steps[k].turn() if k < len(plan.steps) else "Action: inventory"
        return "Thought: let me check.\nAction: inventory"

    return policy


def goal_of(idx):
    from agentenv_servers.textcraft_env import TextCraftGame

    game = TextCraftGame(idx)
    return solve(game.observation).goal, len(solve(game.observation).steps)


def config(tmp_path, url, split, **kw):
    base = dict(task="textcraft", backend=BackendSettings(model_name="scripted"), model_type="eval",
                output_dir=str(tmp_path / "out"), env_server_base=url, split_file=split, max_steps=4, concurrency=2,
                max_token_length=100000, env_retry_delay=0.0)
    base.update(kw)
    return ev.EvalSettings(**base)


def read_results(cfg):
    return {p.name: json.loads(p.read_text()) for p in sorted(cfg.run_dir().glob("search_results_*.json"))}


def test_scores_steps_step_limit_and_batching(tmp_path, textcraft_server):
    solved_idx, loop_idx = 3, 7
    goal, plan_len = goal_of(solved_idx)
    assert plan_len <= 4, "pick a task the expert solves within max_steps"
    backend = ScriptedBackend(expert_or_loop({goal}))
    cfg = config(tmp_path, textcraft_server, split_file(tmp_path, [solved_idx, loop_idx]), max_steps=4)
    done = ev.evaluate(cfg, backend)
    summary = done.summary
    assert (done.ran, done.failed, done.skipped, done.exit_code) == (2, 0, 0, 0)

    res = read_results(cfg)
    assert set(res) == {f"search_results_{solved_idx}.json", f"search_results_{loop_idx}.json"}
    won, looped = res[f"search_results_{solved_idx}.json"], res[f"search_results_{loop_idx}.json"]
    assert list(won)[:5] == ["task_id", "env_score", "model_name", "step_num", "state"]
    assert (won["task_id"], won["env_score"], won["step_num"], won["ended_by"], won["success"]) == \
        (solved_idx, 1.0, plan_len, "done", True)
    assert (looped["env_score"], looped["step_num"], looped["ended_by"], looped["success"]) == \
        (0.0, 4, "step_limit", False)
    for r in (won, looped):
        state = r["state"]
        assert [m["role"] for m in state[:4]] == ["system", "user", "assistant", "user"]
        assert state[3]["content"].startswith("Crafting commands:")   # initial observation verbatim
        assert len(state) == 4 + 2 * r["step_num"]
        assert [m["role"] for m in state[4:]] == ["assistant", "user"] * r["step_num"]
    assert looped["state"][-1]["content"].startswith("Inventory")
    assert won["state"][-1]["content"].startswith("Crafted") or won["state"][-1]["content"].startswith("Got")

    # every round, all live episodes share one generate call
    assert backend.batch_sizes == [2] * plan_len + [1] * (4 - plan_len)
    assert summary["tasks"] == 2 and summary["score_x100"] == pytest.approx(50.0)
    assert summary["success_rate"] == pytest.approx(0.5)
    assert summary["mean_steps"] == pytest.approx((plan_len + 4) / 2)
    assert (summary["step_limit"], summary["failed"], summary["disaster"]) == (1, 0, 0)
    assert summary["loops"]["1"] == {"episodes": 1, "fraction": 0.5, "count": 3}
    on_disk = json.loads((cfg.run_dir() / "summary.json").read_text())
    assert on_disk["score_x100"] == summary["score_x100"] and on_disk["config"]["max_steps"] == 4
    manifest = json.loads((cfg.run_dir() / "manifest.json").read_text())
    assert manifest["items"][str(loop_idx)] == {"env_score": 0.0, "step_num": 4, "ended_by": "step_limit",
                                                "env_restarts": 0}
    assert manifest["config"]["model_name"] == "scripted" and manifest["config"]["backend"]["model_name"] == "scripted"
    assert manifest["finished"] is not None and manifest["config"]["concurrency"] == 2


def test_results_do_not_depend_on_concurrency(tmp_path, textcraft_server):
    """A seed-dependent policy gives identical result files at concurrency 1, 3
    and 8: request seeds derive from (seed, task, step), not from batch
    position, and the episodes end at different steps so batches shrink."""
    actions = ["inventory", "get 1 stick", "get 2 iron ingot", "craft 1 stick using 1 oak planks", "get 1 oak logs"]

    def policy(messages, i, seed):
        return f"Thought: seed {seed}.\nAction: {actions[seed % len(actions)]}"

    split = split_file(tmp_path, [0, 5, 9, 11, 13, 17, 20, 24, 31, 40])
    runs, batches = [], []
    for conc in (1, 3, 8):
        cfg = config(tmp_path, textcraft_server, split, concurrency=conc, max_steps=6, model_type=f"c{conc}", seed=7)
        backend = ScriptedBackend(policy)
        ev.evaluate(cfg, backend)
        runs.append(read_results(cfg))
        batches.append(max(backend.batch_sizes))
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) == 10
    assert batches == [1, 3, 8]


def test_resume_skips_done_and_redoes_corrupt(tmp_path, textcraft_server):
    split = split_file(tmp_path, [0, 1, 2])
    cfg = config(tmp_path, textcraft_server, split, max_steps=2)
    first = ev.evaluate(cfg, ScriptedBackend(lambda m, i, s: "Action: inventory")).summary
    run_dir = cfg.run_dir()
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
        manifest = json.loads((cfg.run_dir() / "manifest.json").read_text())
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


def test_revision_task_continues_from_replayed_state(tmp_path, textcraft_server):
    idx = 3
    goal, _ = goal_of(idx)
    from agentenv_servers.textcraft_env import TextCraftGame

    plan = solve(TextCraftGame(idx).observation)
    first_get = plan.steps[0]
    # a failed prefix: a useless inventory check, then the first correct get
    prefix = conv.initial_conversation("old instruction", "old observation")
    prefix = conv.append_turn(prefix, "Thought: hmm.\nAction: inventory", "Inventory: You are not carrying anything.")
    prefix = conv.append_turn(prefix, first_get.turn(), "stale text from the original run")
    for m in prefix[conv.HEAD_LEN::2]:
        m["loss"] = False
    rev = tmp_path / "low.jsonl"
    rev.write_text(json.dumps({"task_num": str(idx), "low_log": prefix, "high_log": []}) + "\n")

    seen = []

    def policy(messages, i, seed):
        seen.append(messages)
        k = model_turns(messages) - 1   # the replayed inventory turn is not in the plan
        return plan.steps[k].turn() if k < len(plan.steps) else "Action: inventory"

    cfg = config(tmp_path, textcraft_server, None, revise_from=str(rev), max_steps=20)
    summary = ev.evaluate(cfg, ScriptedBackend(policy)).summary
    assert cfg.run_dir().name == "scripted_eval_revise"
    # the first model call sees the replayed env's observation, not the stale stored one
    first = seen[0]
    assert model_turns(first) == 2 and first[-1]["role"] == "user"
    assert first[-1]["content"].startswith("Got ")
    assert "stale" not in json.dumps(first)
    assert first[3]["content"].startswith("Crafting commands:")  # from the env, not the file
    (res,) = read_results(cfg).values()
    assert res["task_id"] == idx and res["env_score"] == 1.0 and res["ended_by"] == "done"
    assert res["replayed_steps"] == 2 and res["model_steps"] == len(plan.steps) - 1
    assert res["step_num"] == len(plan.steps) + 1
    assert summary["mode"] == "revise" and summary["score_x100"] == pytest.approx(100.0)


def test_sciworld_wrong_focus_is_a_disaster_scored_zero(tmp_path, sciworld_server):
    """Focusing on the wrong object fails a ScienceWorld task with reward -100;
    the episode ends there and records score 0."""
    turns = ["Thought: where am I?\nAction: look around", "Thought: that must be it.\nAction: focus on picture",
             "Action: look around"]
    policy = lambda m, i, s: turns[model_turns(m)]  # noqa: E731
    cfg = config(tmp_path, sciworld_server, split_file(tmp_path, [0], "sciworld"), task="sciworld", max_steps=3,
                 concurrency=1)
    summary = ev.evaluate(cfg, ScriptedBackend(policy)).summary
    (res,) = read_results(cfg).values()
    assert res["state"][3]["content"].startswith("Your task is to boil water")
    assert (res["env_score"], res["step_num"], res["ended_by"], res["success"]) == (0.0, 2, "disaster", False)
    assert "focus on the picture" in res["state"][-1]["content"]
    assert (summary["disaster"], summary["score_x100"], summary["step_limit"]) == (1, 0.0, 0)
