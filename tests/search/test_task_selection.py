"""Which tasks a search covers: the bundled splits follow their documented
rules, test-split tasks are never searched (also when a user's split file
lists them, and for SciWorld's variations), and a list of test tasks only is
a usage error."""
from __future__ import annotations

import collections
import json

import pytest

from agent_r import envs, splits
from agent_r.envs import sciworld
from agent_r.search import SearchSettings
from agent_r.settings import UsageError, parse
from agentenv_client.sciworld import SCIWORLD_TASKS, build_game_list, build_game_nums
from tests.support.faults import SEARCH_DOUBLE, files, run_script
from tests.support.search_runs import TEXTCRAFT


def test_textcraft_train_and_test_are_disjoint_and_follow_the_rule():
    rules = envs.get_env("textcraft")
    train, test = rules.split_indices("train"), rules.split_indices("test")
    assert (train, test) == splits.textcraft_split()
    assert len(test) == 100 and all(i % 5 == 0 and i < 500 for i in test)
    assert len(train) == 444 and not set(train) & set(test)
    assert sorted(train + test) == list(range(544))


def test_sciworld_test_split_is_served_and_disjoint_from_search_positions():
    games = build_game_list()
    game_nums = build_game_nums(games, sorted(name for _, name, _ in SCIWORLD_TASKS))
    served = [t for t, idxs in game_nums.items() if idxs]
    assert sorted(served) == sorted(sciworld.SCIWORLD_TRAIN_TASK_NUMS) == sorted(sciworld.SCIWORLD_SEARCH_ORDER)
    test = envs.get_env("sciworld").split_indices("test", split="project")
    assert len(test) == len(set(test)) == 201 and all(0 <= i < len(games) for i in test)
    per_type = collections.Counter(games[i][0] for i in test)
    assert len(per_type) == 23 and max(per_type.values()) == 10
    search = sciworld.sciworld_train_indices(game_nums, sciworld.SCIWORLD_SEARCH_ORDER, 5)
    assert len(search) == 23 * 5 and not set(search) & set(test)
    assert [games[i][1] for i in search[:5]] == [1, 2, 3, 4, 5]  # positions 1..5: variation 0 skipped


def test_sciworld_unserved_task_number_is_a_usage_error():
    game_nums = build_game_nums(build_game_list(), sorted(name for _, name, _ in SCIWORLD_TASKS))
    with pytest.raises(UsageError, match="task number 10 is not served"):
        sciworld.sciworld_train_indices(game_nums, [10], 5)


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
