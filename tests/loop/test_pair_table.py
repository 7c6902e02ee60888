"""reproduction/pair_table.py: two recipes' evals gathered pair by pair into
results.json / .md / .png, counted from the episode files (greedy pairs by
McNemar, sampled by the paired bootstrap), a pair with an unfinished half
listed as pending, a summary found in its committed copy or among the
run's sampled summaries, and a bad pairs file refused with a message that
names it."""
import json

import pytest
from PIL import Image

from agent_r import conversation as conv
from agent_r import passk, report
from agent_r.envs import get_env
from agent_r.settings import UsageError
from agent_r.significance import mcnemar_exact
from reproduction import pair_table

REFUSAL = "Could not find a valid recipe for that item."


def episode(task: int, success: bool, refusals: int, sample: int | None = None) -> dict:
    state = conv.initial_conversation("instr", "Goal: craft stick.")
    for _ in range(refusals):
        state = conv.append_turn(state, "Thought: try.\nAction: craft 1 stick using 9 dirt", REFUSAL)
    state = conv.append_turn(state, "Thought: go.\nAction: get 1 stick", "Got 1 stick")
    row = {"task_id": task, "env_score": float(success), "model_name": "m", "step_num": refusals + 1,
           "state": state, "success": success, "ended_by": "done" if success else "step_limit"}
    if sample is not None:
        row.update(task_key=str(task), sample=sample)
    return row


def write_eval(root, rel: str, rows: list[dict], summary_at: str | None = "here", machine: str = "cpu-a") -> str:
    folder = root / rel
    folder.mkdir(parents=True)
    for row in rows:
        key = f"{row['task_id']}_s{row['sample']}" if "sample" in row else str(row["task_id"])
        (folder / f"search_results_{key}.json").write_text(json.dumps(row))
    if summary_at:
        summary = report.summarize_dir(folder, report.env_of_run(folder))
        summary["provenance"] = {"model_sha256": "x", "backend": "vllm", "dtype": "bfloat16", "machines": [machine],
                                 "commits": ["c"], "settings": {"temperature": 0.0}}
        if summary_at.endswith(".json"):   # kept apart from its run, found by the run_dir it records
            summary["run_dir"] = rel
            (root / summary_at).parent.mkdir(parents=True, exist_ok=True)
            (root / summary_at).write_text(json.dumps(summary))
            return rel
        where = folder if summary_at == "here" else root / summary_at
        where.mkdir(parents=True, exist_ok=True)
        (where / "summary.json").write_text(json.dumps(summary))
    return rel


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref_solved, other_solved = {0, 1}, {1, 2, 3}
    greedy_ref = write_eval(tmp_path, "runs/a/iter_1/eval/m/textcraft/m-iter1_test",
                            [episode(i, i in ref_solved, refusals=2) for i in range(4)])
    # the other half's summary only in its committed copy under reproduction/
    greedy_other = write_eval(tmp_path, "runs/b/iter_1/eval/m/textcraft/m-iter1_test",
                              [episode(i, i in other_solved, refusals=1) for i in range(4)],
                              summary_at="reproduction/b/iter_1/eval/m/textcraft/m-iter1_test")
    ref_wins = {0: 1, 1: 2, 2: 0}
    other_wins = {0: 3, 1: 2, 2: 1}
    # the reference's summary only among the run's sampled summaries in reproduction/a/passk/
    write_eval(tmp_path, "runs/a/iter_0/eval/m/sampled/textcraft/m-iter0_test_samples4", [episode(0, True, 0, 0)],
               summary_at="reproduction/a/passk/decoy_summary.json")
    sampled_ref = write_eval(tmp_path, "runs/a/iter_1/eval/m/sampled/textcraft/m-iter1_test_samples4",
                             [episode(t, s < ref_wins[t], 0, sample=s) for t in range(3) for s in range(4)],
                             summary_at="reproduction/a/passk/m_iter1_samples4_summary.json")
    sampled_other = write_eval(tmp_path, "runs/b/iter_1/eval/m/sampled/textcraft/m-iter1_test_samples4",
                               [episode(t, s < other_wins[t], 0, sample=s) for t in range(3) for s in range(4)],
                               machine="cpu-b")
    unfinished = write_eval(tmp_path, "runs/b/iter_2/eval/m/textcraft/m-iter2_test", [episode(0, True, 0)],
                            summary_at=None)
    pairs = [{"model": "m1", "eval": "greedy", "reference": greedy_ref, "other": greedy_other},
             {"model": "m1", "eval": "sampled", "reference": sampled_ref, "other": sampled_other, "note": "why"},
             {"model": "m2", "eval": "greedy", "reference": greedy_ref, "other": unfinished}]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "pairs.json").write_text(json.dumps(pairs))
    return tmp_path, ref_wins, other_wins


def test_pairs_counted_from_the_episodes(two_runs, capsys):
    root, ref_wins, other_wins = two_runs
    assert pair_table.main(["--pairs", "out/pairs.json"]) == 0
    rows = json.loads((root / "out" / "results.json").read_text())["rows"]
    greedy, sampled, pending = rows

    assert greedy["paired"]["gained"] == 2 and greedy["paired"]["lost"] == 1
    assert greedy["paired"]["p_value"] == pytest.approx(mcnemar_exact(2, 1), abs=1e-3)
    assert greedy["reference_figures"]["success_pct"] == 50 and greedy["other_figures"]["success_pct"] == 75
    assert greedy["reference_figures"]["failed_ending_in_accepted_repeats"] == 0
    assert greedy["reference_figures"]["refused_per_episode"] == 2
    assert greedy["other_figures"]["refused_per_episode"] == 1
    assert greedy["other_figures"]["provenance"]["machines"] == ["cpu-a"]   # read from the committed copy
    assert greedy["provenance_warnings"] == []                    # different weights are the point of a pair

    expected = sum(other_wins[t] / 4 - ref_wins[t] / 4 for t in range(3)) / 3
    assert sampled["paired"]["pass_at_1"]["value"] == pytest.approx(expected, abs=1e-4)
    assert sampled["paired"]["pass_at_4"]["value"] == pytest.approx(
        sum(passk.pass_at_k(4, other_wins[t], 4) - passk.pass_at_k(4, ref_wins[t], 4) for t in range(3)) / 3, abs=1e-4)
    assert any("cpu-b" in w for w in sampled["provenance_warnings"])   # a machine difference is said
    assert sampled["reference_figures"]["provenance"]["machines"] == ["cpu-a"]   # read from passk/

    assert pending["pending"] == "other not finished" and "paired" not in pending

    md = (root / "out" / "results.md").read_text()
    assert "2 gained / 1 lost" in md and "pending: other not finished" in md and "m1, sampled: why" in md
    assert "2.00 -> 1.00" in md
    with Image.open(root / "out" / "results.png") as image:
        drawn = json.loads(image.text["Description"])
    assert set(drawn) == {"m1, greedy (p 1)", "m1, sampled"}
    assert "2 of 3 pairs finished" in capsys.readouterr().out


def test_an_episode_ending_in_an_accepted_repeat_is_counted():
    spec = get_env("textcraft")
    state = conv.initial_conversation("instr", "Goal: craft stick.")
    state = conv.append_turn(state, "Thought: try.\nAction: craft 1 stick using 9 dirt", REFUSAL)
    for _ in range(5):
        state = conv.append_turn(state, "Thought: more.\nAction: Get 4  oak log", "Got 4 oak log")
    stuck = {"state": state, "success": False}
    assert report.accepted_repeat_tail(stuck, spec) == 5
    refused_last = {"state": conv.append_turn(state, "Thought: go.\nAction: get 4 oak log", REFUSAL)}
    assert report.accepted_repeat_tail(refused_last, spec) == 0
    other_last = {"state": conv.append_turn(state, "Thought: go.\nAction: inventory", "Inventory: oak log")}
    assert report.accepted_repeat_tail(other_last, spec) == 1


def test_a_bad_pairs_file_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pairs.json").write_text(json.dumps({"model": "m"}))
    with pytest.raises(UsageError, match="pairs.json must be a JSON list"):
        pair_table.main(["--pairs", "pairs.json"])
    with pytest.raises(UsageError, match="cannot read the pairs file missing.json"):
        pair_table.main(["--pairs", "missing.json"])


def test_greedy_and_sampled_halves_are_not_paired(two_runs):
    root, _, _ = two_runs
    pairs = json.loads((root / "out" / "pairs.json").read_text())
    pairs[0]["other"] = pairs[1]["other"]
    (root / "out" / "pairs.json").write_text(json.dumps(pairs))
    with pytest.raises(UsageError, match="one half is sampled and the other greedy"):
        pair_table.main(["--pairs", "out/pairs.json"])


def test_each_cell_counts_what_its_heading_says(tmp_path, monkeypatch):
    """The sentence cell's interval is over the episodes that write the
    sentence, the repeat cell counts failed episodes only, the machine cell
    names both halves' machines, and a half with a summary but no episode
    files (a summary banked without them) is pending."""
    from agent_r.revision import REVISION_THOUGHTS
    from agent_r.significance import wilson_interval

    monkeypatch.chdir(tmp_path)

    def played(task: int, success: bool, turns: list[tuple[str, str]]) -> dict:
        state = conv.initial_conversation("instr", "Goal: craft stick.")
        for turn, reply in turns:
            state = conv.append_turn(state, turn, reply)
        return {"task_id": task, "env_score": float(success), "model_name": "m", "step_num": len(turns),
                "state": state, "success": success, "ended_by": "done" if success else "step_limit"}

    revise = (f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait", "Could not execute wait")
    get = ("Thought: go.\nAction: get 1 stick", "Got 1 stick")
    rows = [played(0, True, [revise, get]), played(1, False, [revise, get]), played(2, False, [revise, get]),
            played(3, True, [get] * 5), played(4, False, [get] * 5), played(5, False, [get])]
    ref = write_eval(tmp_path, "runs/a/iter_1/eval/m/textcraft/m-iter1_test", rows, machine="cpu-a")
    other = write_eval(tmp_path, "runs/b/iter_1/eval/m/textcraft/m-iter1_test", rows, machine="cpu-b")
    no_episodes = write_eval(tmp_path, "runs/b/iter_2/eval/m/textcraft/m-iter2_test", rows)
    for banked_without in (tmp_path / no_episodes).glob("search_results_*.json"):
        banked_without.unlink()
    (tmp_path / "pairs.json").write_text(json.dumps([
        {"model": "m1", "eval": "greedy", "reference": ref, "other": other},
        {"model": "m2", "eval": "greedy", "reference": ref, "other": no_episodes}]))
    assert pair_table.main(["--pairs", "pairs.json"]) == 0
    done, pending = json.loads((tmp_path / "results.json").read_text())["rows"]

    figures = done["reference_figures"]
    assert (figures["sentence_succeeded"], figures["sentence_episodes"]) == (1, 3)
    assert figures["sentence_wilson_pct"] == [round(100 * x, 1) for x in wilson_interval(1, 3)]
    assert figures["failed_ending_in_accepted_repeats"] == 1          # task 4; task 3 succeeded the same way
    assert pending["pending"] == "other not finished"
    line = next(l for l in (tmp_path / "results.md").read_text().splitlines() if l.startswith("| m1 |"))
    assert "cpu-a / cpu-b" in line


def test_the_halves_are_named_as_labels_says(two_runs):
    root, _, _ = two_runs
    assert pair_table.main(["--pairs", "out/pairs.json", "--labels", "masked,cleaned"]) == 0
    md = (root / "out" / "results.md").read_text()
    assert "| model | eval | masked | cleaned | cleaned - masked, paired |" in md
    assert "--labels 'masked,cleaned'" in md and "paper's" not in md
    with pytest.raises(UsageError, match="give two names"):
        pair_table.main(["--pairs", "out/pairs.json", "--labels", "masked"])
