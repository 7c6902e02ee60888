"""One episode against the real local env servers, driven by the
ScriptedBackend test double: reset, one model turn per step (its prompt
truncated to MAX_TOKEN_LENGTH - 60, sampled at TEMP, seeded by task and
step so results do not depend on concurrency), until done, a disaster
(scored 0) or max_steps (100 by default); all live episodes share one model
call per round; the revision task replays a failed prefix first."""
from __future__ import annotations

import json

import pytest

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import paths
from agent_r.conversation import TRUNCATION_MARGIN, initial_conversation
from agent_r.evaluation import EvalSettings, evaluate
from agent_r.llm import derive_seed
from agent_r.settings import UsageError, parse
from agentenv_servers.textcraft_expert import solve
from tests.support.doubles import ScriptedBackend
from tests.support.eval_runs import config, expert_or_loop, goal_of, model_turns, read_results, split_file, trajectory


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
    on_disk = json.loads((paths.eval_dir(cfg) / "summary.json").read_text())
    assert on_disk["score_x100"] == summary["score_x100"] and on_disk["config"]["max_steps"] == 4
    manifest = json.loads((paths.eval_dir(cfg) / "manifest.json").read_text())
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
    assert paths.eval_dir(cfg).name == "scripted_eval_revise"
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


WORDY = "Thought: " + "I keep checking what I carry " * 4 + "\nAction: inventory"


def settings_for(tmp_path, server: str, *flags: str, **env: str) -> EvalSettings:
    return parse(EvalSettings, ["--env_server_base", server, "--output_dir", str(tmp_path), "--model_name", "m",
                                "--limit", "1", *flags], {"TASK": "textcraft", **env})


def results(run) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run.run_dir.glob("search_results_*.json"))]


def test_eval_prompt_is_truncated_to_max_token_length(tmp_path, textcraft_server):
    """Each request is the conversation so far with the oldest
    (turn, observation) pairs after message 3 dropped - just enough of them to
    fit MAX_TOKEN_LENGTH - 60 tokens (the backend's count), never the newest."""
    probe = ScriptedBackend(lambda m, i, s: WORDY)
    from agent_r import envs

    with envs.get_env("textcraft").make_client(textcraft_server) as client:
        client.reset(envs.get_env("textcraft").split_indices("test", server=textcraft_server)[0])
        head = probe.count_tokens(initial_conversation(client.instruction, client.observe()))
    budget_pairs = 3
    pair = len(WORDY.split()) + len("Inventory: You are not carrying anything.".split())
    max_len = head + TRUNCATION_MARGIN + budget_pairs * pair + pair // 2
    backend = ScriptedBackend(lambda m, i, s: WORDY)
    run = evaluate(settings_for(tmp_path, textcraft_server, "--max_steps", "8", MAX_TOKEN_LENGTH=str(max_len)),
                   backend)
    (result,) = results(run)
    state = result["state"]
    assert len(state) == 4 + 2 * 8                           # the stored trajectory keeps every turn
    sent = [r.messages for b in backend.batches for r in b.requests]
    assert len(sent) == 8
    budget = max_len - TRUNCATION_MARGIN
    for step, messages in enumerate(sent):
        full = state[:4 + 2 * step]                          # what the model would see untruncated
        kept = (len(messages) - 4) // 2
        assert [{"role": m["role"], "content": m["content"]} for m in messages] == full[:4] + full[len(full) - 2 * kept:]
        assert kept == min(step, budget_pairs)               # as many pairs as fit, and no fewer
        assert backend.count_tokens(messages) <= budget or kept == 1
    assert max(len(m) for m in sent) < len(state) - 2        # truncation really happened


def test_temp_reaches_the_sampler_in_eval(tmp_path, textcraft_server):
    backend = ScriptedBackend(lambda m, i, s: "Thought: look.\nAction: inventory")
    evaluate(settings_for(tmp_path, textcraft_server, "--max_steps", "3", TEMP="0.35"), backend)
    assert backend.batches and {b.sampling.temperature for b in backend.batches} == {0.35}


def test_eval_runs_100_model_steps_by_default(tmp_path, textcraft_server):
    settings = settings_for(tmp_path, textcraft_server)
    assert settings.max_steps == 100
    backend = ScriptedBackend(lambda m, i, s: "Thought: look.\nAction: inventory")
    (result,) = results(evaluate(settings, backend))
    assert (result["ended_by"], result["step_num"], result["model_steps"]) == ("step_limit", 100, 100)
    assert backend.stats.requests == 100


def test_derive_seed_depends_only_on_seed_task_step():
    a = derive_seed(0, "12", 3)
    assert a == derive_seed(0, "12", 3)
    assert len({a, derive_seed(1, "12", 3), derive_seed(0, "13", 3), derive_seed(0, "12", 4)}) == 4


def test_revise_jobs_from_path_collection_rows(tmp_path):
    low = trajectory(["get 1 a", "get 1 b"])
    rows = [{"task_num": "7", "low_log": low, "high_log": []},
            {"task_num": "7", "low_log": trajectory(["get 1 c"])},
            {"task_num": 3, "messages": low}]
    path = tmp_path / "rev.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    jobs = ev.load_revise_tasks(str(path))
    assert [(j.idx, j.key) for j in jobs] == [(7, "7_0"), (7, "7_1"), (3, "3_0")]
    assert [conv.parse_action(t) for t in jobs[0].prefix_turns] == ["get 1 a", "get 1 b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"low_log": []}\n')
    with pytest.raises(UsageError, match="line 1"):
        ev.load_revise_tasks(str(bad))
