"""Reading the action out of a model turn: the last ``Action:`` line (numbered
labels and list markers dropped), else the last non-empty line; turns are
stored with plain "Thought:"/"Action:" labels."""
from __future__ import annotations

import pytest

from agent_r.conversation import normalise_turn, parse_action


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
    """The last Action: line wins, "1."/"2)" markers are dropped; without one, the last non-empty line."""
    assert parse_action(turn) == action


@pytest.mark.parametrize("turn,action", [
    ("Thought: I need wood.\nAction: get 1 oak log", "get 1 oak log"),
    ("Thought 1: x\nAction 1: 1. craft 4 oak planks using 1 oak log", "craft 4 oak planks using 1 oak log"),
    ("Action: a\nAction: b  ", "b"),
    ("no label here\n\n  inventory  \n", "inventory"),
    ("", ""),
])
def test_parse_action_with_numbered_labels(turn, action):
    """Numbered labels ("Action 1:") and trailing spaces are handled; of several Action lines, the last."""
    assert parse_action(turn) == action


def test_normalise_turn_renames_numbered_labels_only():
    """Numbered labels become plain "Thought:"/"Action:"; the turn is stripped."""
    assert normalise_turn("Thought 1: a\nAction 12: b") == "Thought: a\nAction: b"
    assert normalise_turn("  Thought: a\nAction: b  ") == "Thought: a\nAction: b"


def test_normalise_turn_of_a_numbered_turn():
    """A numbered thought and action come out with plain labels."""
    assert normalise_turn("Thought 2: hm\nAction 2: inventory") == "Thought: hm\nAction: inventory"
