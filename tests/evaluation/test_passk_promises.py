"""What the Pass@k docs promise, each held by a test that fails when it
breaks: the interval is the 95% one and the same in every process; a k grid
stops at the fewest episodes any task has; a paired difference pairs only
tasks where both runs have k episodes; K > 1 at TEMP 0 is refused from K = 2;
a sampled revision-task episode keeps its row's failed prefix and counts
under its row, never pooled with another row of the same test task."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import passk
from agent_r.episode import Task
from agent_r.loop import IterateSettings
from agent_r.settings import UsageError, parse
from tests.support.doubles import ScriptedBackend
from tests.support.eval_runs import config, model_turns, read_results, split_file


def test_the_interval_is_the_95_percent_one():
    """For 100 tasks at p = 0.5 the mean's standard error is 0.05: a 95%
    interval is about +-0.098 (90%: +-0.082, 99%: +-0.129)."""
    values = [1.0, 0.0] * 50
    low, high = passk.bootstrap_interval(values)
    assert 0.09 < 0.5 - low < 0.108 and 0.09 < high - 0.5 < 0.108     # each tail 2.5%, not 5% nor 0.5%


def test_the_bootstrap_is_the_same_in_every_process():
    """Seeded on its own: not the global random state, not the hash seed."""
    code = ("import random, sys; from agent_r import passk; random.seed(int(sys.argv[1])); "
            "print(passk.bootstrap_interval([0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75, 1.0, 0.0, 0.1]))")
    root = Path(__file__).resolve().parents[2]
    got = {subprocess.run([sys.executable, "-c", code, str(seed)], capture_output=True, text=True, check=True, cwd=root,
                          env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(got) == 1


def test_unequal_episode_counts_stop_the_k_grid_at_the_fewest():
    counts = {"1": {"episodes": 4, "successes": 1}, "2": {"episodes": 2, "successes": 0},
              "3": {"episodes": 4, "successes": 4}}
    assert list(passk.summarize(counts)) == ["1", "2"]


def test_a_paired_difference_pairs_only_tasks_where_both_have_k_episodes():
    four = {"1": {"episodes": 4, "successes": 0}, "2": {"episodes": 4, "successes": 0},
            "3": {"episodes": 4, "successes": 0}}
    other = {"1": {"episodes": 4, "successes": 4}, "2": {"episodes": 2, "successes": 2},
             "3": {"episodes": 8, "successes": 0}}
    diff = passk.paired_difference(four, other, 4)
    assert diff["tasks"] == 2 and diff["value"] == pytest.approx(0.5)    # task 2 has only 2 episodes there
    assert passk.paired_difference(four, other, 2)["tasks"] == 3


@pytest.mark.parametrize("k", [2, 4])
def test_k_samples_at_temp_0_are_refused_from_k_2_in_eval_and_in_the_loop(tmp_path, k):
    with pytest.raises(UsageError, match="TEMP=0 is greedy"):
        config(tmp_path, "http://127.0.0.1:9", split_file(tmp_path, [0]), eval_samples=k, temperature=0.0).finish()
    with pytest.raises(UsageError, match="EVAL_SAMPLE_TEMP=0 is greedy"):
        parse(IterateSettings, [], {"TASK": "textcraft", "EVAL_SAMPLES": str(k), "EVAL_SAMPLE_TEMP": "0"})


def test_the_loops_greedy_evals_keep_eval_temp_when_it_samples():
    from agent_r.loop.models import Policy
    from agent_r.loop.stages import eval_settings

    s = parse(IterateSettings, [], {"TASK": "textcraft", "EVAL_SAMPLES": "4", "EVAL_TEMP": "0",
                                    "EVAL_SAMPLE_TEMP": "0.7"})
    p = Policy("m", "m", s.backend)
    assert eval_settings(s, "textcraft", Path("o"), p).temperature == 0.0
    assert eval_settings(s, "textcraft", Path("o"), p, revise_from=Path("r.jsonl")).temperature == 0.0
    sampled = eval_settings(s, "textcraft", Path("o"), p, samples=4)
    assert (sampled.temperature, sampled.eval_samples) == (0.7, 4)


def test_a_sampled_key_belongs_to_its_row():
    assert Task(12, "12_0").sampled(3).task_key == "12_0"
    assert Task(12, "12_1").sampled(3).task_key == "12_1"
    assert Task(12, "12").sampled(3).task_key == "12"
    assert Task(12, "12_0").sampled(3).key == "12_0_s3"


def test_sampled_revision_episodes_replay_their_prefix_and_count_per_row(tmp_path, textcraft_server):
    """Two rows of one test task, two samples each: every episode replays
    its own row's prefix, and Pass@k counts rows 12_0 and 12_1 apart."""
    idx = 0
    rows = []
    for j, useless in enumerate(["inventory", "inventory"]):
        prefix = conv.initial_conversation("old instruction", "old observation")
        for _ in range(j + 1):                                   # row j replays j + 1 useless turns
            prefix = conv.append_turn(prefix, f"Thought: hmm.\nAction: {useless}", "stale")
        rows.append({"task_num": str(idx), "low_log": prefix, "high_log": []})
    rev = tmp_path / "rows.jsonl"
    rev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replayed = []

    def policy(messages, i, seed):
        replayed.append(model_turns(messages))
        return "Thought: look.\nAction: inventory"

    cfg = config(tmp_path, textcraft_server, None, revise_from=str(rev), max_steps=1, eval_samples=2,
                 temperature=1.0)
    summary = ev.evaluate(cfg, ScriptedBackend(policy)).summary
    results = read_results(cfg)
    assert sorted(results) == [f"search_results_{k}.json" for k in ("0_0_s0", "0_0_s1", "0_1_s0", "0_1_s1")]
    for name, r in results.items():
        row = 0 if "_0_s" in name else 1
        assert r["replayed_steps"] == row + 1                     # its own row's prefix, replayed
        assert r["task_key"] == f"0_{row}"
    assert sorted(replayed) == [1, 1, 2, 2]
    assert sorted(summary["per_task"]) == ["0_0", "0_1"]
    assert all(c["episodes"] == 2 for c in summary["per_task"].values())


def test_solved_overlap_counts_tasks_each_run_reaches_on_equal_tries():
    """Widening is a task the other run solves and the first never does; a task
    one run has played fewer times (a run still going) is not counted."""
    first = {"1": {"episodes": 4, "successes": 1}, "2": {"episodes": 4, "successes": 0},
             "3": {"episodes": 4, "successes": 2}, "4": {"episodes": 4, "successes": 0},
             "5": {"episodes": 4, "successes": 0}}
    other = {"1": {"episodes": 4, "successes": 3}, "2": {"episodes": 4, "successes": 1},
             "3": {"episodes": 4, "successes": 0}, "4": {"episodes": 2, "successes": 1}}
    got = passk.solved_overlap(first, other)
    assert got == {"tasks": 3, "both": 1, "only_other": 1, "only_reference": 1}
    assert passk.solved_overlap(first, {"9": {"episodes": 4, "successes": 1}}) is None
