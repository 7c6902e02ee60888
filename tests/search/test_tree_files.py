"""Tree files: every node is written with exactly the reference's keys in
order, as strict JSON that JavaScript, Go, Rust and Jackson parsers read (an
unvisited node's puct_value is 0, as the reference wrote it, and no writer
ever emits NaN or Infinity); a file loads back into exactly the nodes
written, and a broken node is refused naming where it sits."""
from __future__ import annotations

import json
import math

import pytest

from agent_r.envs import get_env
from agent_r.io import atomic_write_json, atomic_write_jsonl
from agent_r.search import SearchSettings, collect_trees
from agent_r.tree import Node, TreeFormatError, load_tree
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
