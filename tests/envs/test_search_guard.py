"""A search never touches a test task of the split in use, however its tasks
are chosen (default list, --split, --split_file, SciWorld task numbers) and on
whichever server (ours or AgentGym's)."""
from __future__ import annotations

import json
import logging

from agent_r import splits
from agent_r.envs import get_env, load_split_file
from agent_r.envs.sciworld import SCIWORLD_SEARCH_ORDER, sciworld_train_indices
from agent_r.search import SearchSettings, select_tasks
from agentenv_client.sciworld import SCIWORLD_TASKS, build_game_list, build_game_nums
from tests.envs.doubles import search_settings

TEXTCRAFT, SCIWORLD, WEBSHOP = get_env("textcraft"), get_env("sciworld"), get_env("webshop")


def test_search_on_agentgyms_textcraft_never_touches_the_papers_test_tasks(fake_server, caplog):
    """Pointed at AgentGym's TextCraft server with the project's train list,
    the 79 ids that are AgentEval test tasks are skipped with a warning (they
    used to be searched); the default there is the paper's 374 train ids."""
    url = fake_server()
    project_train = str(splits.SPLIT_DIR / "textcraft_train.json")
    paper_test = set(TEXTCRAFT.split("agenteval").indices("test", "textcraft"))
    assert len(paper_test & set(load_split_file(project_train))) == 79
    with caplog.at_level(logging.WARNING):
        chosen = select_tasks(TEXTCRAFT, SearchSettings(task="textcraft", split_file=project_train), url)
    assert len(chosen) == 444 - 79 and not set(chosen) & paper_test
    assert "skipping 79 test task(s) of the 'agenteval' split" in caplog.text
    default, where = TEXTCRAFT.search_indices(search_settings(), url)   # default there: the paper's train list
    assert len(default) == 374 and not set(default) & paper_test and where.endswith("of the 374 train tasks")


def test_search_on_our_textcraft_server_skips_the_project_test_tasks(textcraft_server):
    """On our server a split file of the paper's test ids loses the project's
    test ids; --split agenteval searches the paper's 374 train ids."""
    project_test = set(TEXTCRAFT.split("project").indices("test", "textcraft"))
    chosen, _ = TEXTCRAFT.search_indices(search_settings(split_file=str(splits.SPLIT_DIR /
                                                                         "textcraft_agenteval_test.json")),
                                         textcraft_server)
    assert chosen and not set(chosen) & project_test
    paper = TEXTCRAFT.search_indices(search_settings(split="agenteval"), textcraft_server)[0]
    assert len(paper) == 374


def test_webshop_test_tasks_are_excluded_by_default(fake_server, tmp_path):
    """WebShop searches its 3,930 train ids by default, and a split file
    mixing in test ids keeps only the others."""
    url = fake_server()
    test = WEBSHOP.split("agenteval").indices("test", "webshop")
    chosen, _ = WEBSHOP.search_indices(search_settings(), url)
    assert len(chosen) == 3930 and not set(chosen) & set(test)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([{"item_id": f"webshop_{i}"} for i in [6, test[0], 8, test[1]]]))
    assert WEBSHOP.search_indices(search_settings(split_file=str(mixed)), url)[0] == [6, 8]


def test_sciworld_search_drops_the_papers_test_variations(sciworld_server):
    """SciWorld's search positions lose the one AgentEval test game among
    them; with the project split (whose test variations lie further on) all
    positions are searched."""
    games = build_game_list()
    game_nums = build_game_nums(games, sorted(name for _, name, _ in SCIWORLD_TASKS))
    positions = sciworld_train_indices(game_nums, SCIWORLD_SEARCH_ORDER, 5)
    paper_test = set(SCIWORLD.split("agenteval").indices("test", "sciworld"))
    overlap = [i for i in positions if i in paper_test]
    assert len(overlap) == 1                                    # one AgentEval test game sits at position 2
    settings = search_settings(task_num=None, task_iteration=5)
    chosen, where = SCIWORLD.search_indices(settings, sciworld_server)
    assert chosen == [i for i in positions if i not in paper_test] and where.endswith("positions 1..5")
    project = SCIWORLD.search_indices(search_settings(task_num=None, task_iteration=5, split="project"),
                                      sciworld_server)[0]
    assert project == positions                                 # the project's test variations lie further on
