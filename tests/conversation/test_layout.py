"""The message layout every stage shares: system prompt, instruction, "Ok.",
the task, then assistant turns and observations alternating; a step's
observation is stored on one line, the task text verbatim."""
from __future__ import annotations

from agent_r.conversation import append_turn, clean_observation, initial_conversation


def test_initial_conversation_layout():
    """Index 0 system, 1 the instruction, 2 "Ok.", 3 the task."""
    assert initial_conversation("INSTR", "TASK") == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "INSTR"},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "TASK"},
    ]


def test_append_turn_cleans_step_observation_only():
    """append_turn adds the normalised turn and the one-line observation, leaves
    the task text alone and does not change its input."""
    msgs = initial_conversation("instr", "Crafting commands:\nx\n\nGoal: craft y.")
    out = append_turn(msgs, "Thought 1: t\nAction 1: get 1 y", "Got\t1\ny")
    assert out[3]["content"] == "Crafting commands:\nx\n\nGoal: craft y."
    assert out[4] == {"role": "assistant", "content": "Thought: t\nAction: get 1 y"}
    assert out[5] == {"role": "user", "content": "Got 1 y"}
    assert len(msgs) == 4  # input not mutated


def test_observations_are_stored_on_one_line():
    """\r, \n and \t in a step observation become spaces; the task text keeps its lines."""
    assert clean_observation("a\r\nb\tc\nd") == "a  b c d"
    stored = append_turn(initial_conversation("I", "T\nwith lines"), "Thought 1: t\nAction 1: a", "x\ty\r\nz")
    assert stored[3]["content"] == "T\nwith lines"                 # the task text is kept verbatim
    assert stored[4:] == [{"role": "assistant", "content": "Thought: t\nAction: a"},
                          {"role": "user", "content": "x y  z"}]
