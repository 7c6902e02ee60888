"""Conversation layout, tree schema and atomic IO: the pieces every stage shares."""
import json

import pytest

from agent_r.conversation import append_turn, initial_conversation, normalise_turn, parse_action, truncate
from agent_r.io import atomic_write_json
from agent_r.tree import NODE_KEYS, Node, TreeFormatError, leaf_paths, load_tree


@pytest.mark.parametrize("turn,action", [
    ("Thought: I need wood.\nAction: get 1 oak log", "get 1 oak log"),
    ("Thought 1: x\nAction 1: 1. craft 4 oak planks using 1 oak log", "craft 4 oak planks using 1 oak log"),
    ("Action: a\nAction: b  ", "b"),
    ("no label here\n\n  inventory  \n", "inventory"),
    ("", ""),
])
def test_parse_action(turn, action):
    assert parse_action(turn) == action


def test_normalise_turn():
    assert normalise_turn("Thought 2: hm\nAction 2: inventory") == "Thought: hm\nAction: inventory"


def test_append_turn_cleans_step_observation_only():
    msgs = initial_conversation("instr", "Crafting commands:\nx\n\nGoal: craft y.")
    out = append_turn(msgs, "Thought 1: t\nAction 1: get 1 y", "Got\t1\ny")
    assert out[3]["content"] == "Crafting commands:\nx\n\nGoal: craft y."
    assert out[4] == {"role": "assistant", "content": "Thought: t\nAction: get 1 y"}
    assert out[5] == {"role": "user", "content": "Got 1 y"}
    assert len(msgs) == 4  # input not mutated


def test_truncate_drops_oldest_pairs_and_keeps_head():
    msgs = initial_conversation("i", "o")
    for k in range(5):
        msgs = append_turn(msgs, f"Action: a{k}", f"obs{k}")
    count = lambda m: 10 * len(m)  # noqa: E731 - 10 tokens per message
    out = truncate(msgs, max_tokens=60 + 80, count_tokens=count)
    assert out[:4] == msgs[:4]
    assert len(out) == 8 and out[4]["content"] == "Action: a3"
    assert [m["role"] for m in out[4:]] == ["assistant", "user"] * 2
    # never drops the newest pair even if still too long
    assert truncate(msgs, max_tokens=61, count_tokens=count)[4:] == msgs[-2:]


def _tree():
    root = Node(state=initial_conversation("i", "o"))
    a = root.add_child(Node(visits=1, value=1.0, depth=1, is_terminal=True, action="a", env_score=1.0))
    b = root.add_child(Node(visits=1, value=0.0, depth=1, is_terminal=False, action="b"))
    c = b.add_child(Node(visits=0, depth=2, action="c"))
    root.visits, root.value = 2, 1.0
    return root, a, b, c


def test_node_json_key_order_and_roundtrip(tmp_path):
    root, *_ = _tree()
    data = root.to_dict()
    assert tuple(data) == NODE_KEYS
    assert tuple(data["children"][1]["children"][0]) == NODE_KEYS
    assert data["prior"] == 1 and data["puct_value"] == 0.5
    assert data["children"][1]["children"][0]["puct_value"] == 0     # unvisited: 0, as the reference wrote it
    atomic_write_json(tmp_path / "t.json", data)
    again = load_tree(tmp_path / "t.json")
    assert again.to_dict() == data


def test_leaf_paths_are_terminal_childless_in_order():
    root, a, b, c = _tree()
    assert leaf_paths(root) == [[a]]
    c.is_terminal = True
    assert leaf_paths(root) == [[a], [b, c]]


def test_corrupt_and_schema_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"visits": 1')
    with pytest.raises(TreeFormatError, match="bad.json: corrupt JSON"):
        load_tree(p)
    p.write_text(json.dumps({"visits": 1}))
    with pytest.raises(TreeFormatError, match="missing keys"):
        load_tree(p)


def test_atomic_write_uses_umask_permissions(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "p.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temp file left
