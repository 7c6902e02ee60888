"""The bundled split files follow their documented rules (agent_r/splits)."""
from __future__ import annotations

import collections

import pytest

from agent_r import envs, splits
from agent_r.envs import sciworld
from agent_r.settings import UsageError
from agentenv_client.sciworld import SCIWORLD_TASKS, build_game_list, build_game_nums


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
