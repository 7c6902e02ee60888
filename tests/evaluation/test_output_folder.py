"""An eval run's folder is {output_dir}/{TASK}/{model folder}_{MODEL_TYPE},
always inside the output root: a served model named by a path gives its last
part, a hub id `org/name` gives `org--name`; result files, summary and
manifest land there, and each result keeps the model's name as served."""
from __future__ import annotations

import json

import pytest

from tests.support.served_names import FOLDER, KINDS, files_under, openai_env, run_in, served_name


@pytest.mark.parametrize("kind", KINDS)
def test_a_served_model_name_gives_one_run_folder_inside_the_output_root(tmp_path, textcraft_server,
                                                                          openai_policy_server, kind):
    name = served_name(kind, tmp_path)
    res = run_in(tmp_path, "eval.py", "--env_server_base", textcraft_server, "--output_dir", tmp_path / "out",
                 "--limit", 1, "--max_steps", 2, env=openai_env(openai_policy_server, name))
    run_dir = tmp_path / "out" / "textcraft" / f"{FOLDER[kind]}_eval"
    written = files_under(tmp_path)
    assert {f for f in written if not f.startswith(f"out/textcraft/{FOLDER[kind]}_eval/")} == set()
    assert {"summary.json", "manifest.json"} <= {f.rsplit("/", 1)[1] for f in written}
    (result,) = [json.loads(p.read_text()) for p in run_dir.glob("search_results_*.json")]
    assert result["model_name"] == name and result["step_num"] == 2
    assert not (tmp_path / "models").exists() and str(run_dir) in res.stdout
