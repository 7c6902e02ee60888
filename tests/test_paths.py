"""Artefact names (agent_r/paths.py): a model name becomes one folder that
stays inside its parent - a plain name unchanged (the reference's folders), a
path its last part, a hub id `org--name` - and a name that leaves no folder
is a usage error naming the setting to change; only search_results_<idx>.json
files are trees."""
from __future__ import annotations

import pytest

from agent_r import paths
from agent_r.settings import UsageError


@pytest.mark.parametrize("name,folder", [
    ("textcraft-tiny", "textcraft-tiny"), ("Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"),
    ("ft:gpt-4o-mini:org::abc", "ft:gpt-4o-mini:org::abc"), ("my model", "my model"),
    ("/models/llama", "llama"), ("/models/llama/", "llama"), ("./llama", "llama"), ("../../llama", "llama"),
    ("~/models/llama", "llama"), ("/a/b/c/llama", "llama"), ("C:\\models\\llama", "llama"),
    ("models/org/name", "name"), ("runs/smollm2/iter_1/model/agent-r/hf", "hf"),   # relative, 3+ parts
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama--Llama-3.1-8B-Instruct"),
])
def test_a_model_name_becomes_one_folder(name, folder):
    assert paths.folder_name(name) == folder
    assert "/" not in folder and "\\" not in folder and folder not in (".", "..")


@pytest.mark.parametrize("name", ["/", "..", ".", "/..", "./"])
def test_a_name_that_leaves_no_folder_is_a_usage_error(name):
    with pytest.raises(UsageError, match="set MODEL_NAME"):
        paths.folder_name(name)


def test_only_search_results_files_are_trees(tmp_path):
    for name in ("search_results_3.json", "search_results_12.json", "search_results_x.json", "manifest.json",
                 ".search_results_4.json.abc.tmp", "search_results_5.json.bak"):
        (tmp_path / name).write_text("{}")
    assert paths.tree_files(tmp_path) == [(3, tmp_path / "search_results_3.json"),
                                          (12, tmp_path / "search_results_12.json")]
    assert paths.tree_files(tmp_path / "missing") == []
