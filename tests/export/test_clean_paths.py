"""Clean continuations (CLEAN_PATHS=1, agent_r/clean.py) on the real local
TextCraft server: a good path with a refused step, a repeated accepted
`get` and a step after the goal is cut to the expert's own steps, each
observation the one the server returns; a revision row keeps its bad prefix
and revision turn as they were and has only its continuation cut; a row
whose replay misses the goal is left out; each count is reported, and the
default export (the paper's) is untouched."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r.clean import clean_rows
from agent_r.conversation import HEAD_LEN, append_turn, initial_conversation
from agent_r.envs import get_env
from agentenv_servers.textcraft_expert import solve

ROOT = Path(__file__).resolve().parents[2]
TASK = 1
THOUGHT = "Thought: I made a mistake somewhere in the previous steps, so I should stop and rethink my plan.\nAction: wait"


@pytest.fixture(scope="module")
def game(textcraft_server):
    """The task's head messages and the expert's (minimal) actions."""
    client = get_env("textcraft").make_client(textcraft_server)
    try:
        client.reset(TASK)
        head = initial_conversation(client.instruction, client.observe())
    finally:
        client.close()
    head[2]["loss"] = False
    return head, solve(head[3]["content"]).actions


def played(server: str, head: list[dict], actions: list[str], loss: list[bool]) -> list[dict]:
    """``head`` + each action as a turn with the observation the server gives it, played from the start."""
    client = get_env("textcraft").make_client(server)
    try:
        client.reset(TASK)
        messages = [dict(m) for m in head]
        for action, trained in zip(actions, loss):
            out = client.step(action)
            messages = append_turn(messages, f"Thought: next.\nAction: {action}", out.state)
            messages[-2]["loss"] = trained
    finally:
        client.close()
    return messages


def turns(messages: list[dict]) -> list[str]:
    return [m["content"].split("Action: ")[-1] for m in messages[HEAD_LEN:] if m["role"] == "assistant"]


def test_a_good_path_is_cut_to_the_steps_its_goal_needs(game, textcraft_server):
    head, expert = game
    first_get = next(a for a in expert if a.startswith("get "))
    noisy = ["get 1 unobtainium", first_get, *expert, "inventory"]   # refused, a repeat, the path, past the goal
    row = {"task_num": str(TASK), "revise": False, "env": "textcraft",
           "revise_log": played(textcraft_server, head, noisy, [True] * len(noisy))}
    rows, report = clean_rows([row], lambda task: textcraft_server)
    assert len(rows) == 1 and turns(rows[0]["revise_log"]) == expert
    assert rows[0]["revise_log"] == played(textcraft_server, head, expert, [True] * len(expert))
    assert (report.refused_cut, report.unneeded_cut, report.after_goal_cut, report.left_out) == (1, 1, 1, 0)
    assert report.steps_before == len(noisy) and report.kept == 1


def test_a_revision_row_keeps_its_prefix_and_revision_turn_and_cuts_its_continuation(game, textcraft_server):
    head, expert = game
    first_get = next(a for a in expert if a.startswith("get "))
    prefix = [first_get, "craft 1 unobtainium using 1 stick"]     # accepted, then refused: the bad prefix
    good = played(textcraft_server, head, ["inventory", *expert], [True] * (len(expert) + 1))
    bad = played(textcraft_server, head, prefix, [False, False])
    spliced = bad + [{"role": "assistant", "content": THOUGHT, "loss": True}, {"role": "user", "content": "ok."}] \
        + good[HEAD_LEN:]   # the paper's splice: the good path's recorded observations after the bad prefix
    row = {"task_num": str(TASK), "revise": True, "env": "textcraft", "revise_log": spliced, "high_log": good,
           "low_log": bad}
    rows, report = clean_rows([row], lambda task: textcraft_server)
    log = rows[0]["revise_log"]
    assert log[:len(bad) + 2] == spliced[:len(bad) + 2]             # bad prefix and revision turn as they were
    continuation = turns(log)[len(prefix) + 1:]
    assert "inventory" not in continuation and set(continuation) <= set(expert)
    assert len(continuation) == len(expert) - 1                    # the prefix's get already fetched one need
    assert report.spliced == 1 and report.spliced_as_recorded == 0  # inventory differs after the bad prefix
    assert rows[0]["high_log"] == good and rows[0]["low_log"] == bad


def test_a_row_whose_replay_misses_the_goal_is_left_out_and_counted(game, textcraft_server):
    head, expert = game
    short = expert[:-1]
    row = {"task_num": str(TASK), "revise": False, "env": "textcraft",
           "revise_log": played(textcraft_server, head, short, [True] * len(short))}
    rows, report = clean_rows([row], lambda task: textcraft_server)
    assert rows == [] and (report.rows, report.kept, report.left_out) == (1, 0, 1)


def test_the_export_cleans_only_when_asked_and_reports_what_it_cut(game, textcraft_server, tmp_path):
    head, expert = game
    noisy = ["get 1 unobtainium", *expert]
    row = {"task_num": str(TASK), "revise": False,
           "revise_log": played(textcraft_server, head, noisy, [True] * len(noisy))}
    rows = tmp_path / "textcraft_good.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CLEAN_PATHS", "MASK_REFUSED")}
    env.update(PYTHONPATH=str(ROOT), LOGLEVEL="WARNING")

    def export(out: str, *flags: str) -> str:
        r = subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "export", "--format", "xtuner",
                            "--good_ratio", "-1", "--input", str(rows), "--output", str(tmp_path / out), *flags],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    export("paper.json")
    paper = json.loads((tmp_path / "paper.json").read_text())
    assert turns(paper[0]["messages"]) == noisy and not (tmp_path / "paper.clean.json").exists()
    printed = export("clean.json", "--clean_paths", "1", "--env_server_base", textcraft_server)
    assert turns(json.loads((tmp_path / "clean.json").read_text())[0]["messages"]) == expert
    assert "clean paths: 1 of 1 rows kept" in printed and "(1 refused, 0 unneeded, 0 after the goal)" in printed
    assert json.loads((tmp_path / "clean.clean.json").read_text())["refused_cut"] == 1
