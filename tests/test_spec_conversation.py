"""SPEC section 2, the conversation layout, action parsing and observation
cleaning, pinned exactly (agent_r.conversation's public functions)."""
from __future__ import annotations

import pytest

from agent_r.conversation import (append_turn, clean_observation, initial_conversation, normalise_turn,
                                  parse_action, truncate)


def test_initial_conversation_layout():
    assert initial_conversation("INSTR", "TASK") == [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "INSTR"},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "TASK"},
    ]


@pytest.mark.parametrize("turn,action", [
    ("Thought: go.\nAction: get 1 stick", "get 1 stick"),
    ("Thought: go.\nAction 1: get 1 stick", "get 1 stick"),
    ("Action: inventory\nThought: no wait.\nAction:   craft 1 stick using 2 planks  ", "craft 1 stick using 2 planks"),
    ("Thought: x\nAction: 1. get 2 logs", "get 2 logs"),
    ("Thought: x\nAction: 2) inventory", "inventory"),
    ("first line\nsecond line\n\nthird line\n", "third line"),     # no Action: the last non-empty line
    ("only line", "only line"),
    ("", ""),
    ("   \n  \n", ""),
])
def test_parse_action(turn, action):
    assert parse_action(turn) == action


def test_normalise_turn_renames_numbered_labels_only():
    assert normalise_turn("Thought 1: a\nAction 12: b") == "Thought: a\nAction: b"
    assert normalise_turn("  Thought: a\nAction: b  ") == "Thought: a\nAction: b"


def test_observations_are_stored_on_one_line():
    assert clean_observation("a\r\nb\tc\nd") == "a  b c d"
    stored = append_turn(initial_conversation("I", "T\nwith lines"), "Thought 1: t\nAction 1: a", "x\ty\r\nz")
    assert stored[3]["content"] == "T\nwith lines"                 # the task text is kept verbatim
    assert stored[4:] == [{"role": "assistant", "content": "Thought: t\nAction: a"},
                          {"role": "user", "content": "x y  z"}]


def words(messages):
    return sum(len(m["content"].split()) for m in messages)


def test_truncate_drops_oldest_pairs_until_the_budget_fits():
    head = initial_conversation("one two", "three four")             # 4 words + "Ok." = 6 ... see words()
    msgs = head
    for i in range(5):
        msgs = append_turn(msgs, f"turn{i} a b c", f"obs{i} d e")     # 7 words per pair
    base = words(head)
    for pairs in range(1, 6):
        budget = base + 7 * pairs + 60
        out = truncate(msgs, budget, words)
        assert out[:4] == head and out[4:] == msgs[len(msgs) - 2 * pairs:]
        assert truncate(msgs, budget - 1, words)[4:] == msgs[len(msgs) - 2 * max(pairs - 1, 1):]
    assert truncate(msgs, 10, words) == head + msgs[-2:]            # the newest pair always stays
    assert truncate(msgs, 10_000, words) == msgs
