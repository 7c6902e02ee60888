"""The statistics of the loop's results (agent_r/loop/stats.py): McNemar's
exact test on known values, the paired counts, the revision-turn counter, and
the comparisons results.json and results.md show for finished rows."""
from __future__ import annotations

import copy
import json
import math
import multiprocessing
from pathlib import Path

import pytest

from agent_r.conversation import initial_conversation
from agent_r.io import atomic_write_json
from agent_r.loop.results import markdown, with_comparisons
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stats import comparisons, episode_stats, is_revision_turn, revision_turns
from agent_r.significance import mcnemar_exact, paired
from agent_r.paths import result_file
from agent_r.revision import REVISION_THOUGHTS
from agent_r.settings import parse


@pytest.mark.parametrize("gained, lost, p", [
    (10, 2, 0.0386),    # 2 x (1 + 12 + 66) / 2^12
    (2, 10, 0.0386),    # two-sided: symmetric
    (5, 0, 0.0625),     # 2 / 2^5
    (1, 0, 1.0),        # capped at 1
    (0, 0, 1.0),        # no discordant pair: no evidence
    (3, 3, 1.0),
    (20, 5, 0.0041),
])
def test_mcnemar_exact_known_values(gained, lost, p):
    assert round(mcnemar_exact(gained, lost), 4) == p


def test_mcnemar_exact_equals_the_binomial_tail_sum():
    n, k = 30, 9
    tail = sum(math.comb(n, i) * 0.5 ** n for i in range(k + 1))
    assert mcnemar_exact(n - k, k) == pytest.approx(2 * tail)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def test_paired_counts_only_shared_episodes():
    base = {"1": 1, "2": 0, "3": 0, "4": 1, "5": 0}
    model = {"1": 1, "2": 1, "3": 1, "4": 0, "6": 1}   # 5 missing here, 6 missing in base
    assert paired(base, model) == {"tasks": 4, "both": 1, "gained": 2, "lost": 1, "p_value": 1.0}
    assert paired(base, {"9": 1}) is None


def turn(thought: str, action: str) -> str:
    return f"Thought: {thought}\nAction: {action}"


def result(turns: list[str], success: bool, replayed: int = 0) -> dict:
    state = initial_conversation("instruction", "Goal: craft stick.")
    for t in turns:
        state += [{"role": "assistant", "content": t}, {"role": "user", "content": "obs"}]
    return {"task_id": 1, "env_score": float(success), "step_num": len(turns), "state": state,
            "success": success, "ended_by": "done" if success else "step_limit", "replayed_steps": replayed}


def test_a_revision_turn_is_a_revision_thought_or_the_splices_wait():
    assert is_revision_turn(turn(REVISION_THOUGHTS[0], "wait"))
    assert is_revision_turn(turn(REVISION_THOUGHTS[11], "get 1 oak log"))   # every thought counts, any action
    assert is_revision_turn(turn("Hmm,  " + REVISION_THOUGHTS[5].upper(), "craft 1 stick"))   # case, spacing
    assert is_revision_turn(turn("I pause.", "wait"))                                    # the splice's action
    assert not is_revision_turn(turn("I need oak planks.", "get 1 oak log"))
    assert not is_revision_turn(turn("I mistake nothing.", "wait for it"))
    assert not is_revision_turn(turn("Let water boil.", "wait"), task="sciworld")       # a game action there
    assert is_revision_turn(turn(REVISION_THOUGHTS[2], "wait"), task="sciworld")


def test_revision_turns_count_only_the_models_own_turns():
    revising = turn(REVISION_THOUGHTS[3], "wait")
    plain = turn("I get a log.", "get 1 oak log")
    assert revision_turns(result([plain, revising, plain, revising], True)) == 2
    # a replayed prefix (the revision task) is the base model's, not the evaluated model's
    assert revision_turns(result([revising, plain, plain], False, replayed=1)) == 0
    assert revision_turns(result([plain, revising, plain], False, replayed=1)) == 1


def test_refusals_and_accepted_repeats_count_only_the_models_own_actions():
    """The revision task replays a failed base episode's first steps before
    the evaluated model plays: those steps' refusals are the base model's."""
    from agent_r.envs import get_env
    from agent_r.report import accepted_repeat_tail, refused_action_counts

    def played(pairs: list[tuple[str, str]], replayed: int) -> dict:
        done = result([turn("t", action) for action, _ in pairs], False, replayed=replayed)
        for i, (_, observation) in enumerate(pairs):
            done["state"][len(done["state"]) - 2 * len(pairs) + 2 * i + 1]["content"] = observation
        return done

    refused, got = ("craft 1 stick", "Could not find enough items to craft minecraft:stick"), ("get 1 oak log", "Got 1 oak log")
    episode = played([refused, refused, got, refused, got, got], replayed=2)
    assert refused_action_counts([episode], "textcraft")["refused"] == 1
    assert refused_action_counts([played([refused, refused, got, refused, got, got], replayed=0)],
                                 "textcraft")["refused"] == 3
    spec = get_env("textcraft")
    assert accepted_repeat_tail(played([got, got, got], replayed=0), spec) == 3
    assert accepted_repeat_tail(played([got, got, got], replayed=2), spec) == 1


def test_episode_stats_reads_outcomes_and_revision_turns_from_result_files(tmp_path):
    revising = turn(REVISION_THOUGHTS[1], "wait")
    plain = turn("I get a log.", "get 1 oak log")
    files = {"1": result([plain, revising, plain], True), "2": result([revising, plain], False),
             "3": result([plain], True), "4": result([plain, plain], False)}
    for key, data in files.items():
        atomic_write_json(result_file(tmp_path, key), data)
    (result_file(tmp_path, "5")).write_text("{not json")   # unreadable: left out
    got = episode_stats(tmp_path, ["1", "2", "3", "4", "5", "6"])
    refused = got.pop("refused_actions")
    assert got == {"outcomes": {"1": 1, "2": 0, "3": 1, "4": 0},
                   "revision_turns": {"episodes": 2, "succeeded": 1, "once": 2, "turns": 2, "wait_replies": 0,
                                      "after": {"get": 2}, "sentence": {"episodes": 2, "succeeded": 1, "turns": 2},
                                      "bare_wait": {"episodes": 0, "succeeded": 0, "turns": 0},
                                      "ten_or_more": 0}}                 # the summaries' counts
    assert refused["episodes"] == 4


def row(k: int, variant: str, test: dict[str, int], revise: dict[str, int] | None = None) -> dict:
    def part(outcomes):
        return {"textcraft": {"tasks": len(outcomes), "success_pct": 100 * sum(outcomes.values()) / len(outcomes),
                              "loops_pct": {"1": 10.0, "2": 5.0, "3": 0.0, "4": 0.0, "5": 0.0},
                              "outcomes": outcomes, "revision_turns": {"episodes": 1, "succeeded": 1, "turns": 3}}}
    return {"iteration": k, "variant": variant, "test": part(test), "revise_task": part(revise) if revise else {}}


def test_comparisons_pair_every_model_with_the_base_and_agent_r_with_direct(tmp_path):
    keys = [str(i) for i in range(20)]
    base = dict.fromkeys(keys, 0)
    agent_r = {k: int(int(k) < 12) for k in keys}        # gains 12 over the base
    direct = {k: int(int(k) < 2) for k in keys}          # gains 2
    rows = [row(0, "base", base, {"1_0": 0, "2_0": 0}), row(1, "agent-r", agent_r, {"1_0": 1, "2_0": 0}),
            row(1, "direct", direct, {"1_0": 0, "2_0": 0})]
    got = comparisons(rows)
    assert got[(1, "agent-r")]["test"]["textcraft"]["vs_base"] == {
        "tasks": 20, "both": 0, "gained": 12, "lost": 0, "p_value": 0.0004883}
    assert got[(1, "agent-r")]["test"]["textcraft"]["vs_direct"]["gained"] == 10
    assert "vs_direct" not in got[(1, "direct")]["test"]["textcraft"]
    assert got[(1, "agent-r")]["revise_task"]["textcraft"]["vs_base"]["gained"] == 1
    # rows from before outcomes were recorded compare to nothing, and break nothing
    old = copy.deepcopy(rows)
    for r in old:
        del r["test"]["textcraft"]["outcomes"]
    assert comparisons(old)[(1, "agent-r")] == {"revise_task": comparisons(rows)[(1, "agent-r")]["revise_task"]}

    s = parse(IterateSettings, [], {"VARIANTS": "agent-r,direct"})
    in_json = with_comparisons(rows)
    assert "paired" not in in_json[0] and in_json[1]["paired"] == got[(1, "agent-r")]
    json.dumps(in_json)
    md = markdown(s, rows)
    assert "| 1 | agent-r | textcraft test | 12 / 0 (0.000488) | 10 / 0 (0.00195) |" in md
    assert "| 1 | direct | textcraft test | 2 / 0 (0.5) | - |" in md
    assert "10.0/5.0/0.0/0.0" in md and "| 1 (1) |" in md



def _write_results_repeatedly(folder: str, start, failures) -> None:
    from agent_r.paths import Layout
    from agent_r.loop.results import write_results

    s = parse(IterateSettings, [], {"VARIANTS": "agent-r", "ITERATIONS": "1"})
    rows = [row(0, "base", {"1": 0, "2": 1}), row(1, "agent-r", {"1": 1, "2": 1})]
    start.wait()
    try:
        for _ in range(8):
            write_results(s, Layout(Path(folder)), rows, "cpu")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        failures.put(repr(exc))


def test_loop_processes_of_one_run_write_results_at_once(tmp_path):
    """reproduction/reproduce_paper.sh runs one loop process per variant in the same
    run folder; each rewrites results.* after every stage, so the writes
    overlap and none may fail on another's temporary file."""
    ctx = multiprocessing.get_context("fork")
    start, failures = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_write_results_repeatedly, args=(str(tmp_path), start, failures)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    errors = [failures.get() for _ in range(failures.qsize())] if not failures.empty() else []
    assert not errors and all(proc.exitcode == 0 for proc in procs), errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md", "results.png"]


def test_wilson_interval_known_values():
    from agent_r.significance import wilson_interval

    low, high = wilson_interval(30, 100)
    assert (round(low, 4), round(high, 4)) == (0.2189, 0.3959)      # the textbook values
    assert wilson_interval(0, 50)[0] == 0.0 and 0.07 < wilson_interval(0, 50)[1] < 0.072
    assert wilson_interval(8, 60) == pytest.approx((0.0692, 0.2417), abs=1e-4)
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_a_table_of_evals_at_two_dtypes_says_so_and_names_each():
    from agent_r.loop.results import _dtype_note

    def at(k, variant, dtype):
        return {"iteration": k, "variant": variant, "test": {"textcraft": {"dtype": dtype}}}

    assert _dtype_note([at(0, "base", "bfloat16"), at(1, "agent-r", "bfloat16")]) == []
    assert _dtype_note([at(0, "base", None), at(1, "agent-r", "float32")]) == []      # older rows: not recorded
    (blank, line) = _dtype_note([at(0, "base", "bfloat16"), at(1, "agent-r", "float32")])
    assert line.startswith("Mixed dtypes") and "base 0: bfloat16" in line and "agent-r 1: float32" in line


def test_a_table_of_evals_from_two_machines_says_which_row_ran_where():
    from agent_r.loop.results import _machine_note

    def on(k: int, variant: str, *machines: str) -> dict:
        prov = {"machines": list(machines)}
        return {"iteration": k, "variant": variant, "test": {"textcraft": {"provenance": prov}},
                "revise_task": {"textcraft": {"provenance": prov}}}

    assert _machine_note([on(0, "base", "A"), on(1, "agent-r", "A")]) == []
    assert _machine_note([on(0, "base", "unknown"), on(1, "agent-r", "A")]) == []    # nothing to tell apart
    (line,) = [x for x in _machine_note([on(0, "base", "A"), on(1, "agent-r", "B"), on(1, "direct", "A", "B")]) if x]
    assert line.startswith("Mixed machines") and "agent-r 1: B" in line and "direct 1: A + B" in line
