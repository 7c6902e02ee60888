"""SPEC section 3 promises about the search that no other test pins, against
the public functions (agent_r.search, agent_r.envs), the library entry point
(search.collect_trees) and the CLI, with the real local servers: selection
uses the exploration term (cases where c decides); test-split tasks are never
searched, also when a user's split file lists them; TEMP reaches the sampler."""
from __future__ import annotations

import json
import math
import random

import pytest

from agent_r import envs
from agent_r.mcts import select_child
from agent_r.search import SearchSettings, collect_trees, search_trees
from agent_r.settings import parse
from agent_r.tree import EXPLORATION_C, Node
from tests.support.doubles import ScriptedBackend
from tests.support.faults import SEARCH_DOUBLE, files, run_script
from tests.support.search_doubles import SeededTextCraftDouble, seeded_textcraft_policy

TEXTCRAFT = envs.get_env("textcraft")
EXPERT = "python:tests.support.tree_fixtures:expert_or_mistake_backend"   # solves tasks: trees with successes


def explore_or_exploit() -> tuple[Node, Node, Node]:
    """A parent visited 100 times: A is well explored and good on average
    (30 / 50 = 0.6), B barely explored (1.0 / 2 = 0.5). Exploitation alone
    picks A; with c = 0.25 the exploration term of B (0.25 * sqrt(ln 100 / 2)
    = 0.38) outweighs A's (0.08)."""
    parent = Node(visits=100, value=31.0)
    a = parent.add_child(Node(visits=50, value=30.0, depth=1))
    b = parent.add_child(Node(visits=2, value=1.0, depth=1))
    return parent, a, b


def test_selection_uses_the_exploration_term():
    parent, a, b = explore_or_exploit()
    assert EXPLORATION_C == 0.25
    assert b.selection_score(0.25) == pytest.approx(0.5 + 0.25 * math.sqrt(math.log(100) / 2))
    assert a.selection_score(0.25) == pytest.approx(0.6 + 0.25 * math.sqrt(math.log(100) / 50))
    assert select_child(parent, 0.25, random.Random(0)) is b      # c decides ...
    assert select_child(parent, 0.0, random.Random(0)) is a       # ... without it, the mean wins
    assert select_child(parent, EXPLORATION_C, random.Random(0)) is b


def test_selection_counts_the_parents_visits():
    """The exploration term grows with the parent's visits: the same two
    children swap rank when the parent has been visited more."""
    for parent_visits, winner in ((3, "a"), (1000, "b")):
        parent = Node(visits=parent_visits)
        a = parent.add_child(Node(visits=2, value=1.5))    # 0.75 + c*sqrt(ln P / 2)
        b = parent.add_child(Node(visits=1, value=0.6))    # 0.6 + c*sqrt(ln P): ahead once ln P > 4.2
        assert select_child(parent, 0.25, random.Random(0)) is {"a": a, "b": b}[winner]


def trees(server: str, c: float | None, indices=(2, 8)) -> dict[int, str]:
    kwargs = {} if c is None else {"c": c}
    out: dict[int, str] = {}
    search_trees(list(indices), TEXTCRAFT, lambda: TEXTCRAFT.make_client(server), SeededTextCraftDouble(),
                 SearchSettings(max_depth=4, iterations=8, n_gen=3, concurrency=2, **kwargs),
                 on_tree=lambda o: out.__setitem__(o.job.idx, json.dumps(o.result.to_dict())))
    return out


def test_the_search_selects_with_its_c(textcraft_server):
    """Whole searches (same double, same seeds): c = 0 builds other trees
    than the default c = 0.25 on these tasks, and the default is 0.25."""
    default, paper, greedy = trees(textcraft_server, None), trees(textcraft_server, 0.25), \
        trees(textcraft_server, 0.0)
    assert default == paper
    assert all(paper[i] != greedy[i] for i in paper)
    assert parse(SearchSettings, [], {"TASK": "textcraft"}).c == 0.25
    assert parse(SearchSettings, ["--exploration_c", "0"], {"TASK": "textcraft"}).c == 0.0


def test_test_tasks_listed_in_a_split_file_are_never_searched(tmp_path, textcraft_server):
    test = TEXTCRAFT.split_indices("test", server=textcraft_server)
    train = [i for i in range(40) if i not in set(test)][:2]
    listed = test[:3] + train
    split = tmp_path / "mine.json"
    split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in listed]))
    res = run_script("mcts_collection.py", "--env_server_base", textcraft_server, "--backend", SEARCH_DOUBLE,
                     "--model_name", "m", "--split_file", split, "--output_dir", tmp_path / "out",
                     env={"TASK": "textcraft", "MAX_DEPTH": "1", "ITERA": "1", "N_GEN": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert set(files(tmp_path / "out" / "textcraft" / "m")) == {f"search_results_{i}.json" for i in train}
    assert "never searched" in res.stderr and str(test[0]) in res.stderr


def test_only_test_tasks_listed_is_a_usage_error(tmp_path, textcraft_server):
    test = TEXTCRAFT.split_indices("test", server=textcraft_server)
    split = tmp_path / "mine.json"
    split.write_text(json.dumps(test[:4]))
    res = run_script("mcts_collection.py", "--env_server_base", textcraft_server, "--backend", SEARCH_DOUBLE,
                     "--model_name", "m", "--split_file", split, "--output_dir", tmp_path / "out",
                     env={"TASK": "textcraft"})
    assert res.returncode == 2 and "no tasks to search" in res.stderr
    assert not list((tmp_path / "out").rglob("search_results_*.json"))


def test_sciworld_never_searches_a_test_variation(sciworld_server):
    """SciWorld picks search tasks by task number and variation position; a
    task number whose variations include test ids keeps none of them."""
    spec = envs.get_env("sciworld")
    test = set(spec.split_indices("test", server=sciworld_server))
    with spec.make_client(sciworld_server) as client:
        game_nums = client.game_nums()
    num = next(t for t in sorted(game_nums) if test & set(game_nums[t][1:]))   # a number with test variations
    settings = parse(SearchSettings, ["--task_num", str(num), "--task_iteration", "10000"], {"TASK": "sciworld"})
    chosen, _ = spec.search_indices(settings, sciworld_server)
    assert chosen and not set(chosen) & test
    assert set(chosen) == set(game_nums[num][1:]) - test


def test_temp_reaches_the_sampler_in_search(tmp_path, textcraft_server):
    settings = parse(SearchSettings, ["--env_server_base", textcraft_server, "--output_dir", str(tmp_path),
                                      "--model_name", "m", "--min", "1", "--max", "3"],
                     {"TASK": "textcraft", "TEMP": "0.35", "ITERA": "2", "MAX_DEPTH": "2", "N_GEN": "2"})
    backend = ScriptedBackend(seeded_textcraft_policy)
    summary = collect_trees(settings, backend=backend)
    assert summary.done == 2 and backend.batches
    assert {b.sampling.temperature for b in backend.batches} == {0.35}


def test_collect_trees_resumes_and_records_its_run(tmp_path, textcraft_server):
    """The library entry point of mcts_collection.py: trees of the selected
    train tasks under {output_dir}/{TASK}/{model name} (the bundled model's
    name when MODEL_NAME is unset), the instruction file reaching the prompt,
    a manifest naming server, model and task count; a rerun searches nothing
    and a deleted tree is redone alone."""
    from agent_r.llm import BUNDLED_MODEL

    instruction = tmp_path / "instruction.txt"
    instruction.write_text("MY OWN INSTRUCTION: answer with Action: <action>.")
    env = {"TASK": "textcraft", "ITERA": "3", "MAX_DEPTH": "3", "N_GEN": "2",
           "AGENTENV_INSTRUCTION_FILE": str(instruction)}
    flags = ["--env_server_base", textcraft_server, "--output_dir", str(tmp_path / "out"), "--min", "1", "--max", "4",
             "--backend", EXPERT]
    folder = tmp_path / "out" / "textcraft" / BUNDLED_MODEL.name
    first = collect_trees(parse(SearchSettings, flags, env))         # the settings' own backend, made and closed
    assert (first.done, first.skipped, first.failed) == (3, 0, [])
    assert set(files(folder)) == {f"search_results_{i}.json" for i in (1, 2, 3)}
    assert first.out_dir == str(folder) and first.leaves > 0 and first.env_steps > 0
    root = json.loads((folder / "search_results_2.json").read_text())
    assert root["state"][1]["content"] == instruction.read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    config, items, stats = manifest["config"], manifest["items"], manifest["stats"]
    assert (config["env_server_base"], config["model_name"], config["indices"]) == \
        (textcraft_server, BUNDLED_MODEL.name, 3)
    assert set(items) == {"1", "2", "3"} and manifest["finished"] and manifest["backend"]["backend"]
    for key in ("leaves", "successful_leaves", "env_steps"):        # the summary adds up the trees
        assert getattr(first, key) == stats[key] == sum(item[key] for item in items.values()), key
    assert (stats["done"], stats["skipped"], stats["failed"]) == (3, 0, 0) and stats["backend"]["calls"] > 0
    assert sum(item["successful_leaves"] > 0 for item in items.values()) >= 2   # sums over trees, not the last

    idle = ScriptedBackend(seeded_textcraft_policy)
    again = collect_trees(parse(SearchSettings, flags, env), backend=idle)
    assert (again.done, again.skipped) == (0, 3) and idle.batches == []
    (folder / "search_results_2.json").unlink()
    redo = collect_trees(parse(SearchSettings, flags, env), backend=idle)
    assert (redo.done, redo.skipped) == (1, 2) and set(files(folder)) == {f"search_results_{i}.json" for i in (1, 2, 3)}
