"""The revision task: the base model's failed test episodes, each cut at a
seeded random step, continued by a model for at most --revise_max_steps
turns. The rows are eval.py --revise_from's format, so a real eval replays
exactly the base model's turns before the cut and then lets the model play."""
from __future__ import annotations

import json
from pathlib import Path

from agent_r import evaluation
from agent_r.conversation import HEAD_LEN, initial_conversation
from agent_r.loop.models import Policy
from agent_r.loop.revise_task import cut_messages, revise_rows, write_revise_tasks
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stages import eval_settings
from agent_r.settings import parse
from tests.support.doubles import ScriptedBackend


def episode(idx: int, turns: int, success: bool = False, ended_by: str = "step_limit") -> dict:
    state = initial_conversation("instruction", f"Goal: task {idx}.")
    for t in range(turns):
        state += [{"role": "assistant", "content": f"Thought: t{t}\nAction: get {t} oak log"},
                  {"role": "user", "content": f"obs {t}"}]
    return {"task_id": idx, "env_score": float(success), "step_num": turns, "state": state, "success": success,
            "ended_by": "done" if success else ended_by}


def test_every_failed_episode_is_cut_at_a_seeded_step_that_replays_some_turns_and_never_the_last():
    results = [episode(3, 6), episode(1, 5, ended_by="disaster"), episode(2, 4, success=True),
               episode(4, 1), episode(5, 7, ended_by="error"), episode(6, 2)]
    rows, counts = revise_rows(results, "textcraft", seed=0, limit=None)
    # successes and env errors are no failures; a one-turn episode has nothing to cut
    assert counts == {"failed": 4, "eligible": 3, "episodes": 3}
    assert [r["task_num"] for r in rows] == [1, 3, 6]
    for r in rows:
        assert 1 <= r["cut"] <= r["base_turns"] - 1
        turns = [m["content"] for m in r["messages"][HEAD_LEN:] if m["role"] == "assistant"]
        assert turns == [f"Thought: t{t}\nAction: get {t} oak log" for t in range(r["cut"])]
        assert r["messages"][-1] == {"role": "user", "content": f"obs {r['cut'] - 1}"}   # ends on its observation
    assert rows == revise_rows(results, "textcraft", seed=0, limit=None)[0]            # seeded
    many = [episode(i, 40) for i in range(30)]
    cuts = {s: [r["cut"] for r in revise_rows(many, "textcraft", seed=s, limit=None)[0]] for s in (0, 1)}
    assert cuts[0] != cuts[1] and len(set(cuts[0])) > 5                                # random, not fixed


def test_a_cap_keeps_a_seeded_sample_in_task_order():
    results = [episode(i, 5) for i in range(20)]
    rows, counts = revise_rows(results, "textcraft", seed=0, limit=6)
    picked = [r["task_num"] for r in rows]
    assert counts == {"failed": 20, "eligible": 20, "episodes": 6}
    assert picked == sorted(picked) and picked != list(range(6))
    assert picked == [r["task_num"] for r in revise_rows(results, "textcraft", seed=0, limit=6)[0]]
    assert revise_rows(results, "textcraft", seed=0, limit=0)[0] == []


def test_cut_messages_keeps_the_head_and_whole_turns():
    state = episode(1, 3)["state"]
    assert cut_messages(state, 0) == state[:HEAD_LEN]
    assert cut_messages(state, 2) == state[:HEAD_LEN + 4]
    assert cut_messages(state, 3) == state


def test_the_revision_task_runs_at_most_revise_max_steps_turns(tmp_path):
    s = parse(IterateSettings, ["--eval_max_steps", "100", "--revise_max_steps", "7"], {})
    p = Policy("m", "m", s.backend)
    assert eval_settings(s, "textcraft", tmp_path, p).max_steps == 100
    assert eval_settings(s, "textcraft", tmp_path, p, revise_from=tmp_path / "r.jsonl").max_steps == 7
    assert parse(IterateSettings, [], {}).revise_max_steps == 50 and parse(IterateSettings, [], {}).revise_limit is None


def test_eval_replays_the_base_turns_before_the_cut_then_the_model_plays(tmp_path, textcraft_server):
    """End to end on the real server: a base model that fails, its failures
    cut, and a second model continuing them through eval's --revise_from."""
    def run(out: Path, label: str, policy, revise_from: Path | None = None) -> evaluation.EvalRun:
        settings = parse(evaluation.EvalSettings, ["--output_dir", str(out), "--env_server_base", textcraft_server,
                                                   "--max_steps", "3" if revise_from else "6", "--limit", "3",
                                                   "--model_name", label, "--concurrency", "2"]
                         + (["--revise_from", str(revise_from)] if revise_from else []),
                         {"TASK": "textcraft", "TEMP": "0"})
        return evaluation.evaluate(settings, ScriptedBackend(policy))

    # the base model: a different wrong action each turn, so every turn is recognisable
    base = run(tmp_path, "base", lambda msgs, i, seed: f"Thought: try.\nAction: get {len(msgs)} stick")
    target = tmp_path / "revise_tasks_textcraft.jsonl"
    counts = write_revise_tasks(base.run_dir, target, "textcraft", seed=0, limit=None)
    assert counts["episodes"] == 3
    rows = [json.loads(line) for line in target.read_text().splitlines()]

    continued = run(tmp_path, "next", lambda msgs, i, seed: "Thought: look.\nAction: inventory", revise_from=target)
    assert continued.summary["tasks"] == 3
    for n, row in enumerate(rows):
        got = json.loads((continued.run_dir / f"search_results_{row['task_num']}_0.json").read_text())
        base_result = json.loads((base.run_dir / f"search_results_{row['task_num']}.json").read_text())
        keep = HEAD_LEN + 2 * row["cut"]
        assert got["replayed_steps"] == row["cut"] and got["model_steps"] == 3
        assert got["state"][:keep] == base_result["state"][:keep]       # the base model's turns and observations
        assert all(m["content"].endswith("inventory") for m in got["state"][keep:] if m["role"] == "assistant")
