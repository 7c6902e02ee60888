"""path_collection.py reads the trees mcts_collection.py wrote for the same
settings: by default the search folder under its own --output_dir when that
holds trees (both scripts given one --output_dir), else the one under
mcts_result (both scripts' defaults); --input_dir may name the tree folder or
the search's --output_dir. The folder is named after the model as the search
names it, so a served model named by a path or a hub id is found there, and
nothing is read or written outside the run's folders."""
from __future__ import annotations

import json

import pytest

from tests.support.served_names import FOLDER, KINDS, files_under, openai_env, run_in, served_name

SEARCH = {"MAX_DEPTH": "1", "ITERA": "3", "N_GEN": "2"}


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("kind", KINDS)
def test_default_input_is_the_searchs_folder_for_a_served_model_name(tmp_path, textcraft_server,
                                                                     openai_policy_server, kind):
    """Both scripts at their defaults, run from one folder, with the model
    served under a path or a hub id: the verifier (the same served model)
    judges the trees the search wrote."""
    env = openai_env(openai_policy_server, served_name(kind, tmp_path), **SEARCH)
    run_in(tmp_path, "mcts_collection.py", "--env_server_base", textcraft_server, "--min", 1, "--max", 2, env=env)
    res = run_in(tmp_path, "path_collection.py", env=env)
    made = rows(tmp_path / "mcts_training_data" / "textcraft_centric.jsonl")
    assert len(made) == 1 and made[0]["task_num"] == "1" and made[0]["revise"] is True
    assert [f["judgement"] for f in made[0]["revise_feedback"]] == ["Good", "Good"]
    assert "trees read: 1 " in res.stdout and "verifier calls (prompts): 2" in res.stdout
    assert {f.split("/", 1)[0] for f in files_under(tmp_path)} == {"mcts_result", "mcts_training_data"}
    assert (tmp_path / "mcts_result" / "textcraft" / FOLDER[kind] / "search_results_1.json").exists()


def test_one_output_dir_for_both_scripts_or_the_search_root_as_input(tmp_path, textcraft_server,
                                                                     openai_policy_server):
    """mcts_collection.py --output_dir X, then path_collection.py --output_dir
    X finds the trees without --input_dir; --input_dir X (the search's
    --output_dir, not its tree folder) finds them too."""
    env = openai_env(openai_policy_server, "m", **SEARCH)
    run_in(tmp_path, "mcts_collection.py", "--env_server_base", textcraft_server, "--min", 1, "--max", 2,
           "--output_dir", "X", env=env)
    assert (tmp_path / "X" / "textcraft" / "m" / "search_results_1.json").exists()
    run_in(tmp_path, "path_collection.py", "--output_dir", "X", "--revise", 0, env=env)
    shared = rows(tmp_path / "X" / "textcraft_centric.jsonl")
    run_in(tmp_path, "path_collection.py", "--input_dir", "X", "--output_dir", "Y", "--revise", 0, env=env)
    assert len(shared) == 1 and rows(tmp_path / "Y" / "textcraft_centric.jsonl") == shared
    assert not (tmp_path / "mcts_result").exists()
