"""Turns the environment refused, in the XTuner export: counted in what the
export prints, trained by default (the paper trains every turn of a good
path), and with --mask_refused 1 (MASK_REFUSED) kept as history with their
loss off. The revision turn, answered ``ok.``, is never one of them."""
from __future__ import annotations

import json

import pytest

from agent_r import export
from agent_r.envs import get_env
from tests.export.test_cli import run_export
from tests.support.export_rows import HEAD, write_jsonl

REVISION = "Thought: I made a mistake, so I should rethink my plan.\nAction: wait"


def turn(text: str, loss: bool, reply: str) -> list[dict]:
    return [{"role": "assistant", "content": text, "loss": loss}, {"role": "user", "content": reply}]


def revision_row() -> dict:
    log = (HEAD + turn("Action: craft 1 stick using 1 oak log", False, "Could not find a valid recipe for stick")
           + turn(REVISION, True, "ok.")
           + turn("Action: craft 1 oak planks using 1 oak log", True, "Could not find enough items to craft oak planks")
           + turn("Action: get 1 oak log", True, "Got 1 oak log")
           + [{"role": "assistant", "content": "Action: craft 4 oak planks using 1 oak log", "loss": True}])
    return {"task_num": "1", "revise_log": log, "high_log": HEAD, "low_log": HEAD}


def good_row() -> dict:
    return {"task_num": "2", "revise_log": HEAD + turn("Action: wait", True, "Could not execute wait")
            + turn("Action: get 1 bone", True, "Got 1 bone")}


def trained(sample: dict) -> list[str]:
    return [m["content"] for m in sample["messages"] if m["role"] == "assistant" and m["loss"]]


@pytest.mark.parametrize("mask", [False, True])
def test_refused_turns_are_counted_and_with_the_mask_not_trained(tmp_path, mask):
    cen = write_jsonl(tmp_path / "textcraft_centric.jsonl", [revision_row()])
    good = write_jsonl(tmp_path / "textcraft_good.jsonl", [good_row()])
    out = tmp_path / "train.json"
    said = export.write_export(export.ExportSettings(format="xtuner", input=[str(cen), str(good)], output=str(out),
                                                     mask_refused=mask))
    assert "2 of the samples' 6 trained turns got a refusal from the environment" in said
    samples = sorted(json.loads(out.read_text()), key=len)
    by_first = {s["messages"][4]["content"]: s for s in samples}
    rev, kept = by_first["Action: craft 1 stick using 1 oak log"], by_first["Action: wait"]
    refused = {"Action: craft 1 oak planks using 1 oak log", "Action: wait"}
    assert [m["content"] for m in rev["messages"]] == [m["content"].strip() for m in revision_row()["revise_log"]]
    assert REVISION in trained(rev) and "Action: get 1 oak log" in trained(rev)
    assert bool(refused & set(trained(rev) + trained(kept))) is not mask
    assert ("Action: craft 1 oak planks using 1 oak log" in trained(rev)) is not mask


def test_rows_of_an_environment_the_file_name_does_not_say_count_no_refusal(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", [good_row()])
    said = export.write_export(export.ExportSettings(format="xtuner", input=[str(rows)],
                                                     output=str(tmp_path / "t.json"), mask_refused=True))
    assert "refusal" not in said
    assert trained(json.loads((tmp_path / "t.json").read_text())[0]) == ["Action: wait", "Action: get 1 bone"]


def test_the_command_line_takes_the_mask(tmp_path):
    good = write_jsonl(tmp_path / "textcraft_good.jsonl", [good_row()])
    r = run_export("--format", "xtuner", "--input", good, "--output", tmp_path / "t.json", "--mask_refused", "1")
    assert r.returncode == 0, r.stderr
    assert "1 of the samples' 2 trained turns got a refusal from the environment: not trained" in r.stdout
    assert trained(json.loads((tmp_path / "t.json").read_text())[0]) == ["Action: get 1 bone"]


@pytest.mark.parametrize("task,observation,refused", [
    ("textcraft", "Could not execute wait", True),
    ("textcraft", "Could not find enough items to craft stick", True),
    ("textcraft", "Got 1 bone", False),
    ("sciworld", "No known action matches that input.", True),
    ("sciworld", "You move to the kitchen.", False),
    ("webshop", "Invalid action!", False),   # no refusal pattern: nothing is counted
])
def test_each_environment_says_which_observations_refuse_the_action(task, observation, refused):
    assert get_env(task).refused(observation) is refused


@pytest.mark.parametrize("mask", ["0", "1"])
def test_the_loops_data_stage_exports_with_MASK_REFUSED(tmp_path, mask):
    from agent_r.loop.stages import export_rows
    from tests.loop.conftest import FLAGS, SMALL, settings_for

    s = settings_for({**SMALL, "TASK": "textcraft", "MASK_REFUSED": mask}, FLAGS)
    good = write_jsonl(tmp_path / "textcraft_good.jsonl", [good_row()])
    assert export_rows(s, [str(good)], tmp_path / "train.json", str(tmp_path / "no model")) == 1
    wanted = ["Action: get 1 bone"] if mask == "1" else ["Action: wait", "Action: get 1 bone"]
    assert trained(json.loads((tmp_path / "train.json").read_text())[0]) == wanted


@pytest.mark.parametrize("mask", [False, True])
def test_trained_repeats_of_an_accepted_action_are_counted(tmp_path, mask):
    """A repeat after an accepted step is what a model learns as a loop; a
    repeat after a refusal (a retry) or of an untrained turn is not counted,
    and masking leaves the accepted repeats trained."""
    log = (HEAD + turn("Action: get 1 oak log", True, "Got 1 oak log")
           + turn("Action: Get 1  oak log", True, "Got 1 oak log")             # counted (same action, normalised)
           + turn("Action: craft 1 stick using 1 oak log", True, "Could not find a valid recipe for stick")
           + turn("Action: craft 1 stick using 1 oak log", True, "Could not find a valid recipe for stick")  # a retry
           + turn("Action: get 1 oak log", False, "Got 1 oak log")
           + turn("Action: get 1 oak log", True, "Got 1 oak log")              # counted: the one before was accepted
           + turn("Action: get 1 oak log", False, "Got 1 oak log"))            # a repeat, untrained: not counted
    good = write_jsonl(tmp_path / "textcraft_good.jsonl", [{"task_num": "3", "revise_log": log}])
    said = export.write_export(export.ExportSettings(format="xtuner", input=[str(good)],
                                                     output=str(tmp_path / "t.json"), mask_refused=mask))
    assert f"2 of the {3 if mask else 5} trained turns repeat the action the environment had just accepted" in said
    assert export.repeated_accepted_turns([{"revise_log": log, "env": "textcraft"}]) == 2
