"""SPEC section 3 "Tree JSON", read back: a tree file loads into exactly the
nodes that were written (every field, at every depth), and a broken node is
refused naming where it sits in the tree."""
from __future__ import annotations

import json

import pytest

from agent_r.io import atomic_write_json
from agent_r.tree import Node, TreeFormatError, load_tree
from tests.support import tree_fixtures as tf


def odd_tree() -> Node:
    """Every field away from its default, also below the first level."""
    root = tf.make_root(task="Goal: craft 😀 stick.")
    a = tf.add_step(root, "get 1 oak log", "Got 1 oak log")
    tf.add_step(a, "craft 4 tnt using 1 oak log", "The task failed.", disaster=True)
    tf.add_step(a, "craft 4 oak planks using 1 oak log", "Crafted 4 minecraft:oak_planks", score=0.75)
    tf.backup(root)
    a.recent_actions = ["(get 1 oak log, Got 1 oak log)"]          # SciWorld's string form
    return root


def test_a_tree_file_loads_into_the_nodes_written(tmp_path):
    root = odd_tree()
    path = tmp_path / "search_results_3.json"
    atomic_write_json(path, root.to_dict(), indent=2)
    back = load_tree(path)
    assert back.to_dict() == root.to_dict()
    for was, got in zip(root.iter_nodes(), back.iter_nodes()):
        for key in ("visits", "value", "obs", "llm_response", "depth", "is_terminal", "recent_actions", "action",
                    "env_score", "disaster", "state"):
            assert getattr(got, key) == getattr(was, key), key
        assert [c.parent for c in got.children] == [got] * len(got.children)
    disaster = back.children[0].children[0]
    assert disaster.disaster is True and disaster.llm_response.startswith("Thought:")


@pytest.mark.parametrize("breakage,where", [
    (lambda d: d["children"][0]["children"][1].pop("env_score"), "root.children[0].children[1]: node is missing"),
    (lambda d: d["children"][0].__setitem__("visits", "many"), "root.children[0]: bad field value"),
    (lambda d: d["children"][0].__setitem__("children", {}), "root.children[0]: 'children' must be a list"),
    (lambda d: d["children"].append([]), "root.children[1]: expected a node object, got list"),
])
def test_a_broken_node_is_named_by_its_place(tmp_path, breakage, where):
    data = odd_tree().to_dict()
    breakage(data)
    path = tmp_path / "search_results_3.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TreeFormatError) as err:
        load_tree(path)
    assert str(err.value).startswith(f"{path}: {where}")
