"""Summary arithmetic and the repeated-action (loop) statistic, on known data."""
import json

import pytest

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import report
from agent_r.settings import UsageError
from agent_r.llm import derive_seed
from agent_r.envs import get_env


def trajectory(actions: list[str]) -> list[dict]:
    state = conv.initial_conversation("instr", "Goal: craft stick.")
    for a in actions:
        state = conv.append_turn(state, f"Thought: go.\nAction: {a}", "obs")
    return state


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


def test_compare_needs_a_known_task(tmp_path):
    d = tmp_path / "somewhere"
    d.mkdir()
    with pytest.raises(UsageError, match="set TASK"):
        report.compare([str(d)])
    with pytest.raises(UsageError, match="does not exist"):
        report.compare([str(tmp_path / "missing")], task="textcraft")


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


def test_settings_resolve_flag_over_env_over_default(tmp_path):
    from agent_r.settings import manifest_config, parse

    environ = {"TASK": "textcraft", "MODEL_NAME": "from-env", "MODEL_TYPE": "iter1", "TEMP": "0",
               "MAX_TOKEN_LENGTH": "2048", "OPENAI_API_KEY": "sk-secret"}
    s = parse(ev.EvalSettings, ["--model_name", "from-flag", "--limit", "3", "--output_dir", str(tmp_path)], environ)
    assert (s.model_name, s.model_type, s.temperature, s.max_token_length, s.limit) == \
        ("from-flag", "iter1", 0.0, 2048, 3)
    assert (s.max_steps, s.concurrency, s.max_new_tokens, s.env_retries, s.env_retry_delay) == (100, 8, 500, 2, 1.0)
    assert s.run_dir() == tmp_path / "textcraft" / "from-flag_iter1"
    config = s.run_config()
    assert config["backend"]["openai_api_key"] == "***" and config["model_name"] == "from-flag"
    assert set(manifest_config(s)) <= set(config)

    s = parse(ev.EvalSettings, ["--revise_from", "x.jsonl"], {"TASK": "textcraft", "MODEL_DIR": "/m/iter2/"})
    assert s.run_dir().name == "iter2_eval_revise"
    compare = parse(ev.EvalSettings, ["--compare", "a", "b"], {})   # no TASK needed to compare
    assert compare.compare == ["a", "b"] and compare.task is None
    with pytest.raises(UsageError, match="TASK is not set"):
        parse(ev.EvalSettings, [], {})


def test_eval_defaults_follow_the_reference():
    """SPEC section 5: 100 steps per episode; the original eval truncates at 7000 tokens."""
    from agent_r.settings import parse

    s = parse(ev.EvalSettings, [], {"TASK": "textcraft"})
    assert (s.max_steps, s.max_token_length, s.temperature) == (100, 7000, 1.0)
