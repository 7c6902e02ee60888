"""Strict JSON (issue 16, item 4): tree files are read by JavaScript, Go, Rust
and Jackson parsers, which reject NaN/Infinity. An unvisited node's
``puct_value`` is written as the reference wrote it (0), and every JSON/JSONL
writer refuses a non-finite number instead of writing one."""
from __future__ import annotations

import json
import math

import pytest

from agent_r.envs import get_env
from agent_r.io import atomic_write_json, atomic_write_jsonl
from agent_r.search import SearchSettings, collect_trees
from agent_r.tree import Node, load_tree
from tests.support import tree_fixtures as tf
from tests.support.search_doubles import SeededTextCraftDouble


def strict_load(path):
    """json.loads as a strict parser reads: NaN, Infinity and -Infinity are errors."""
    def refuse(word):
        raise ValueError(f"non-standard JSON constant {word}")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def walk(node: dict):
    yield node
    for child in node["children"]:
        yield from walk(child)


def test_searched_trees_parse_strictly_with_unvisited_nodes_at_zero(tmp_path, textcraft_server):
    settings = SearchSettings(task="textcraft", env_server_base=textcraft_server, output_dir=str(tmp_path),
                              iterations=1, n_gen=4, max_depth=3, min=1, max=4)
    settings.backend.model_name = "m"
    summary = collect_trees(settings, SeededTextCraftDouble())
    files = sorted((tmp_path / "textcraft" / "m").glob("search_results_*.json"))
    assert summary.done == len(files) == 3                      # tasks 1-3 (none is a test task)
    unvisited = 0
    for path in files:
        root = strict_load(path)
        for node in walk(root):
            assert math.isfinite(node["puct_value"])
            if node["visits"] == 0:
                unvisited += 1
                assert node["puct_value"] == 0                    # the reference's value
        assert load_tree(path).visits == root["visits"]
    assert unvisited > 0                                        # one iteration leaves siblings untried
    strict_load(tmp_path / "textcraft" / "m" / "manifest.json")


def test_puct_values_written_as_the_reference_computed_them():
    root = tf.make_root()
    a = tf.add_step(root, "get 1 oak log", "Got 1 oak log")
    tf.add_step(a, "craft 4 stick using 2 oak planks", "Crafted 4 minecraft:stick", score=1)
    tf.add_step(root, "get 1 diamond", "Could not find diamond")            # expanded, never visited
    tf.backup(root)
    d = root.to_dict()
    assert d["puct_value"] == 1.0                                           # root: value / visits
    assert d["children"][0]["puct_value"] == 1.0                            # 1/1 + c * sqrt(ln 1 / 1)
    assert d["children"][1]["puct_value"] == 0 and d["children"][1]["visits"] == 0
    assert math.isinf(root.children[1].selection_score())                   # selection still tries it first


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_writers_refuse_non_finite_numbers(tmp_path, bad):
    with pytest.raises(ValueError, match=r"\$\['children'\]\[0\]\['value'\] = .* is not a finite number"):
        atomic_write_json(tmp_path / "t.json", {"visits": 1, "children": [{"value": bad}]})
    with pytest.raises(ValueError, match=r"rows.jsonl row 2: \$\['x'\] = .* is not a finite number"):
        atomic_write_jsonl(tmp_path / "rows.jsonl", [{"x": 1.0}, {"x": bad}])
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "rows.jsonl").exists()


def test_a_non_finite_reward_is_a_server_fault_not_a_score():
    with pytest.raises(ValueError, match="returned a non-finite reward"):
        get_env("textcraft").step_score(float("nan"))


def test_node_round_trip_keeps_the_schema(tmp_path):
    root = Node(state=[{"role": "system", "content": "s"}])
    root.add_child(Node(obs="o", llm_response="r", depth=1, action="a"))
    atomic_write_json(tmp_path / "t.json", root.to_dict())
    data = strict_load(tmp_path / "t.json")
    assert data["children"][0]["puct_value"] == 0 and list(data) == list(root.to_dict())
