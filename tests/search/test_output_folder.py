"""A search's folder is {output_dir}/{TASK}/{model folder}, always inside the
output root: a served model named by a path (what `vllm serve /models/llama`
serves) gives its last part, a hub id `org/name` gives `org--name` (one
folder, not two), and the tree file and manifest land there; the manifest
keeps the name as served."""
from __future__ import annotations

import json

import pytest

from agent_r import paths
from tests.support.served_names import FOLDER, KINDS, files_under, openai_env, run_in, served_name

SEARCH = {"MAX_DEPTH": "1", "ITERA": "3", "N_GEN": "2"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_served_model_name_gives_one_folder_inside_the_output_root(tmp_path, textcraft_server,
                                                                      openai_policy_server, kind):
    name = served_name(kind, tmp_path)
    run_in(tmp_path, "mcts_collection.py", "--env_server_base", textcraft_server, "--output_dir", tmp_path / "out",
           "--min", 1, "--max", 2, env=openai_env(openai_policy_server, name, **SEARCH))
    folder = tmp_path / "out" / "textcraft" / FOLDER[kind]
    assert files_under(tmp_path) == {f"out/textcraft/{FOLDER[kind]}/{f}" for f in ("search_results_1.json",
                                                                                    "manifest.json")}
    assert not (tmp_path / "models").exists()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["config"]["model_name"] == name and manifest["stats"]["done"] == 1


def test_plain_names_keep_the_reference_folder():
    for name in ("textcraft-tiny", "Llama-3.1-8B-Instruct", "gpt-4o-mini", "agent-r-iter1", "m"):
        assert paths.folder_name(name) == name
