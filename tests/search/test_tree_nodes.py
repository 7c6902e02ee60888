"""The MCTS node in memory and on disk: the exact key order of a serialised
node, a round trip through the atomic writer and the loader, which nodes are
leaf paths, and load errors that name the file."""
from __future__ import annotations

import json

import pytest

from agent_r.conversation import initial_conversation
from agent_r.io import atomic_write_json
from agent_r.tree import NODE_KEYS, Node, TreeFormatError, leaf_paths, load_tree


def _tree():
    """root -> a (terminal, solved), b -> c (unvisited); returns (root, a, b, c)."""
    root = Node(state=initial_conversation("i", "o"))
    a = root.add_child(Node(visits=1, value=1.0, depth=1, is_terminal=True, action="a", env_score=1.0))
    b = root.add_child(Node(visits=1, value=0.0, depth=1, is_terminal=False, action="b"))
    c = b.add_child(Node(visits=0, depth=2, action="c"))
    root.visits, root.value = 2, 1.0
    return root, a, b, c


def test_node_json_key_order_and_roundtrip(tmp_path):
    """Every node serialises with NODE_KEYS in order, prior 1 and the puct value
    (0 for an unvisited node); written and loaded back it is the same dict."""
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
    """Leaf paths end at terminal nodes without children, in tree order."""
    root, a, b, c = _tree()
    assert leaf_paths(root) == [[a]]
    c.is_terminal = True
    assert leaf_paths(root) == [[a], [b, c]]


def test_corrupt_and_schema_errors_name_the_file(tmp_path):
    """Corrupt JSON and a node with missing keys raise TreeFormatError naming the file or the keys."""
    p = tmp_path / "bad.json"
    p.write_text('{"visits": 1')
    with pytest.raises(TreeFormatError, match="bad.json: corrupt JSON"):
        load_tree(p)
    p.write_text(json.dumps({"visits": 1}))
    with pytest.raises(TreeFormatError, match="missing keys"):
        load_tree(p)
