"""The summary of an eval run, recomputed from its result files: mean score
x100 on the task's scale, success rate, mean steps, endings, and the loop
statistic (repeated action blocks of period 1-5); --compare puts finished
runs side by side and needs to know each run's task."""
import json

import pytest

from agent_r import report
from agent_r.envs import get_env
from agent_r.settings import UsageError
from tests.support.eval_runs import trajectory


def test_count_repeats_known_trajectory():
    acts = ["get 1 a", "get 1 a", "get 1 a",            # run of 3: two k=1 repeats
            "b", "c", "b", "c", "b", "c",                 # period 2, three blocks
            "x", "y", "z", "x", "y", "z"]                 # one period-3 repeat
    assert report.count_repeats(acts, 1) == 2
    # k=2: "b c b c b c" repeats at i=3,4,5
    # ("get 1 a" twice is a period-1 loop, never a period-2 one)
    assert report.count_repeats(acts, 2) == 3
    # k=3: "x y z x y z" once; also "b c b" vs "c b c"? no; non-primitive blocks never count.
    assert report.count_repeats(acts, 3) == 1
    assert report.count_repeats(acts, 4) == 0
    assert report.count_repeats(acts, 5) == 0
    # a run of identical actions is a period-1 loop only
    assert [report.count_repeats(["a"] * 6, k) for k in (1, 2, 3)] == [5, 0, 0]
    assert report.count_repeats([], 1) == 0
    assert [report.count_repeats(list("ababab"), k) for k in (1, 2, 3)] == [0, 3, 0]


def test_episode_actions_normalise_case_and_spaces():
    state = trajectory(["Get 1  Stick", "get 1 stick"])
    assert report.episode_actions(state) == ["get 1 stick", "get 1 stick"]
    assert report.count_repeats(report.episode_actions(state), 1) == 1


def result(idx, score, steps, ended, actions=("inventory",)):
    return {"task_id": idx, "env_score": score, "model_name": "m", "step_num": steps,
            "state": trajectory(list(actions)), "success": score >= 1, "ended_by": ended}


def test_summarize_arithmetic():
    rows = [
        result(0, 1.0, 3, "done", ["get 1 a", "get 1 a", "craft 1 b"]),
        result(1, 0.0, 5, "step_limit", ["a", "b", "a", "b", "c"]),
        result(2, 0.0, 2, "disaster"),
        result(3, 0.0, 0, "error", []),
    ]
    s = report.summarize(rows, max_score=1.0)
    assert s["tasks"] == 4
    assert s["score_x100"] == pytest.approx(25.0)
    assert s["success_rate"] == pytest.approx(0.25)
    assert s["mean_steps"] == pytest.approx(2.5)
    assert (s["step_limit"], s["disaster"], s["failed"]) == (1, 1, 1)
    assert s["loops"]["1"] == {"episodes": 1, "fraction": 0.25, "count": 1}
    assert s["loops"]["2"] == {"episodes": 1, "fraction": 0.25, "count": 1}
    assert s["loops"]["3"]["count"] == 0


def test_sciworld_scores_normalised_by_max_score():
    rows = [result(0, 100.0, 4, "done"), result(1, 50.0, 4, "step_limit")]
    for r in rows:
        r.pop("success")  # files from the reference scripts: success derived from the score
    s = report.summarize(rows, max_score=get_env("sciworld").max_score)
    assert s["score_x100"] == pytest.approx(75.0)
    assert s["success_rate"] == pytest.approx(0.5)


def test_summary_and_compare_read_every_file(tmp_path, capsys):
    runs = []
    for name, scores in (("iter0_eval", [0.0, 0.0, 1.0]), ("iter1_eval", [1.0, 1.0, 0.0])):
        d = tmp_path / "textcraft" / name
        d.mkdir(parents=True)
        for i, sc in enumerate(scores):
            (d / f"search_results_{i}.json").write_text(json.dumps(result(i, sc, 2, "done")))
        (d / "search_results_9.json").write_text("{corrupt")  # ignored, with a warning
        runs.append(str(d))
    table = report.compare(runs)
    lines = {line.split("  ")[0].strip(): line.split() for line in table.splitlines()}
    assert lines["score x100"][-2:] == ["33.33", "66.67"]
    assert lines["tasks"][-2:] == ["3", "3"]
    assert "iter0_eval" in table.splitlines()[0] and "iter1_eval" in table.splitlines()[0]
    # episode by episode against the first run: tasks 0 and 1 gained, task 2 lost, McNemar p = 1
    paired = [line for line in table.splitlines() if line.startswith("vs first")]
    assert len(paired) == 1 and paired[0].split()[-8:] == ["-", "2", "/", "1", "(p", "1)", "of", "3"]


def test_compare_needs_a_known_task(tmp_path):
    d = tmp_path / "somewhere"
    d.mkdir()
    with pytest.raises(UsageError, match="set TASK"):
        report.compare([str(d)])
    with pytest.raises(UsageError, match="does not exist"):
        report.compare([str(tmp_path / "missing")], task="textcraft")


# --------------------------------------------------------------------------- what follows a revision turn

def episode(turns: list[str], replayed: int = 0, success: bool = False, goal: str = "dried kelp block") -> dict:
    """An eval result of TextCraft whose instruction shows an example goal (another item)."""
    state = [{"role": "system", "content": "s"},
             {"role": "user", "content": "Example:\nGoal: craft oak planks.\n..."},
             {"role": "assistant", "content": "Ok."},
             {"role": "user", "content": f"Crafting commands:\ncraft 1 {goal} using 9 dried kelp\n\nGoal: craft {goal}."}]
    for t in turns:
        state += [{"role": "assistant", "content": t}, {"role": "user", "content": "obs"}]
    return {"state": state, "replayed_steps": replayed, "success": success}


def test_the_turn_after_each_revision_turn_is_classified_against_the_tasks_own_goal():
    from agent_r.revision import REVISION_THOUGHTS
    revise = f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait"
    results = [
        episode(["Action: get 1 kelp", revise, "Action: craft 1 dried kelp block using 9 dried kelp"], success=True),
        episode([revise, "Action: get 9 dried kelp", revise, revise, "Action: craft 9 dried kelp using 9 kelp",
                 revise]),
        episode(["Action: inventory", "Action: get 1 dried kelp"]),                  # never revises
        episode([revise, "Thought: hmm, no action here"], replayed=0),
        episode([revise, "Action: inventory"], replayed=1),   # the replayed revision turn is not the model's
    ]
    counts = report.revision_turn_counts(results, "textcraft")
    assert counts["after"] == {"goal_craft": 1, "get": 1, "revision": 1, "craft": 1, "end": 1, "none": 1}
    assert (counts["episodes"], counts["succeeded"], counts["once"], counts["turns"]) == (3, 1, 2, 6)


def test_action_kinds_name_the_goal_craft_only_for_the_goal_item():
    spec = get_env("textcraft")
    assert spec.goal(["Crafting commands:\n...\n\nGoal: craft dried kelp block."]) == "dried kelp block"
    assert spec.action_kind("craft 1 dried kelp block using 9 dried kelp", "dried kelp block") == "goal_craft"
    assert spec.action_kind("craft 9 dried kelp using 9 kelp", "dried kelp block") == "craft"
    assert spec.action_kind("craft 1 dried kelp block", "dried kelp block") == "goal_craft"
    assert spec.action_kind("get 9 dried kelp", "dried kelp block") == "get"
    assert spec.action_kind("  ", "dried kelp block") == "none"
    assert spec.action_kind("craft 1 dried kelp block", None) == "craft"      # no goal known: no goal craft
    assert get_env("webshop").goal(["Goal: craft x."]) is None     # no goal pattern: no goal craft anywhere


def test_the_compare_table_says_what_follows_the_revision_turns_most_frequent_first():
    results = [episode([REVISE_TURN, "Action: get 1 kelp", REVISE_TURN, "Action: craft 1 dried kelp block using 9 "
                        "dried kelp", REVISE_TURN, "Action: craft 1 dried kelp block"])]
    summary = {"task": "textcraft", "tasks": 1, "score_x100": 0.0, "success_rate": 0.0, "mean_steps": 6.0,
               "step_limit": 1, "disaster": 0, "failed": 0,
               "loops": {str(k): {"episodes": 0, "fraction": 0.0, "count": 0} for k in report.LOOP_LENGTHS},
               "revision_turns": report.revision_turn_counts(results, "textcraft"), "run_dir": "r"}
    rows = {line.split("  ")[0].strip(): line for line in report.format_table([summary]).splitlines()}
    assert rows["next turn after one"].endswith("goal_craft 2, get 1")


def test_the_compare_table_gives_the_revising_episodes_success_a_wilson_interval():
    revising = [episode([REVISE_TURN, "Action: craft 1 dried kelp block"], success=i < 8) for i in range(60)]
    never = [episode(["Action: inventory"])]
    summary = {"task": "textcraft", "tasks": 61, "score_x100": 0.0, "success_rate": 0.0, "mean_steps": 2.0,
               "step_limit": 0, "disaster": 0, "failed": 0,
               "loops": {str(k): {"episodes": 0, "fraction": 0.0, "count": 0} for k in report.LOOP_LENGTHS},
               "revision_turns": report.revision_turn_counts(revising + never, "textcraft"), "run_dir": "r"}
    none = dict(summary, revision_turns=report.revision_turn_counts(never, "textcraft"), run_dir="s")
    rows = {line.split("  ")[0].strip(): line for line in report.format_table([summary, none]).splitlines()}
    assert rows["revision turn eps (won)"].split()[-5:] == ["60", "(8,", "7-24%)", "0", "(0)"]


REVISE_TURN = "Thought: I made a mistake somewhere in the previous steps. I will change my plan.\nAction: wait"


def test_the_compare_table_sums_the_rare_kinds_after_the_revision_turn():
    summary = {"revision_turns": {"after": {"goal_craft": 9, "get": 5, "craft": 4, "revision": 3, "end": 2,
                                            "continue": 2, "thank": 1, "continue[0]": 1, "exit": 1}}}
    assert report._after_cell(summary) == ("goal_craft 9, get 5, craft 4, revision 3, continue 2, end 2, "
                                           "3 other kinds 3")
    assert report._after_cell({"revision_turns": {"after": {}}}) == "-"


def test_the_compare_table_splits_the_wins_into_episodes_without_and_with_a_revision_turn():
    """8 of 60 revising episodes and 3 of 5 that never revise succeed: a
    sampled run's rate is over its episodes, not its tasks."""
    revising = [episode([REVISE_TURN, "Action: craft 1 dried kelp block"], success=i < 8) for i in range(60)]
    never = [episode(["Action: inventory"], success=i < 3) for i in range(5)]
    summary = {"task": "textcraft", "tasks": 13, "episodes": 65, "score_x100": 0.0, "success_rate": 11 / 65,
               "mean_steps": 2.0, "step_limit": 0, "disaster": 0, "failed": 0,
               "loops": {str(k): {"episodes": 0, "fraction": 0.0, "count": 0} for k in report.LOOP_LENGTHS},
               "revision_turns": report.revision_turn_counts(revising + never, "textcraft"), "run_dir": "r"}
    greedy = dict(summary, tasks=5, success_rate=3 / 5, revision_turns=report.revision_turn_counts(never, "textcraft"),
                  run_dir="s")
    del greedy["episodes"]
    rows = {line.split("  ")[0].strip(): line for line in report.format_table([summary, greedy]).splitlines()}
    assert rows["wins: no revision / revised"].split()[-6:] == ["3", "/", "8", "3", "/", "0"]


def test_the_compare_table_counts_the_revision_kinds_the_long_loops_and_the_refusals():
    """The figures a masked and an unmasked model are compared by, in the
    printed table: revising episodes of each kind with their successes,
    episodes with ten or more revision turns, refusals per episode; "-" for
    summaries written before they were counted."""
    from agent_r.revision import REVISION_THOUGHTS
    sentence, bare = f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait", "Action: wait"
    results = [episode([sentence] * 10 + ["Action: craft 1 dried kelp block using 9 dried kelp"], success=True),
               episode([bare, "Action: get 9 dried kelp"]),
               episode(["Action: inventory"])]
    for r in results:   # the env refuses every revision wait, as TextCraft does
        for i, m in enumerate(r["state"][:-1]):
            if m["role"] == "assistant" and m["content"].endswith("Action: wait"):
                r["state"][i + 1]["content"] = "Could not execute wait"
    summary = {"task": "textcraft", "tasks": 3, "score_x100": 0.0, "success_rate": 1 / 3, "mean_steps": 2.0,
               "step_limit": 0, "disaster": 0, "failed": 0,
               "loops": {str(k): {"episodes": 0, "fraction": 0.0, "count": 0} for k in report.LOOP_LENGTHS},
               "revision_turns": report.revision_turn_counts(results, "textcraft"),
               "refused_actions": report.refused_action_counts(results, "textcraft"), "run_dir": "r"}
    old = dict(summary, revision_turns={"episodes": 0, "succeeded": 0, "after": {}}, run_dir="s")
    del old["refused_actions"]
    rows = {line.split("  ")[0].strip(): line for line in report.format_table([summary, old]).splitlines()}
    assert rows["revising eps: sentence / bare"].split()[-8:] == ["1", "(1,", "21-100%)", "/", "1", "(0,", "0-79%)", "-"]
    assert rows["eps with >= 10 revision turns"].split()[-2:] == ["1", "-"]
    assert rows["refused actions per episode"].split()[-8:] == ["3.67", "(11", "of", "11", "at", "a", "wait)", "-"]


def test_runs_of_the_same_name_are_told_apart_by_the_folders_that_differ():
    """A masked and an unmasked model's evals share a folder name; the
    table's heads name each run by where its path differs."""
    labels = report.path_labels(["runs/smollm2/iter_1/eval/agent-r/textcraft/agent-r-iter1_test",
                                 "runs/smollm2-masked/iter_1/eval/agent-r/textcraft/agent-r-iter1_test",
                                 "runs/smollm2/iter_0/eval/base/textcraft/base_test"])
    assert labels == ["smollm2/agent-r-iter1_test", "smollm2-masked/agent-r-iter1_test", "base_test"]
    assert report.path_labels(["a/x/r", "a/y/s"]) == ["r", "s"]   # distinct names stay short
    assert report.path_labels(["a/b/r", "c/r"]) == ["a/b/r", "c/r"]   # paths of other depths
