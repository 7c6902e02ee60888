"""Bad setting values and bad split files: one clear line on stderr, exit 2,
nothing written. Cases other test files already cover are listed in
docs/long-jobs.md."""
from __future__ import annotations

import pytest

from tests.support.faults import SEARCH_DOUBLE, run_script

NOWHERE = "http://127.0.0.1:9"   # never contacted: values are checked first


def one_line_error(res, needle: str) -> None:
    """Exit 2 and exactly one stderr line starting "error: " that holds ``needle``."""
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert needle in res.stderr


@pytest.mark.parametrize("env,needle", [
    ({"N_GEN": "0"}, "N_GEN=0 is too small"),
    ({"N_GEN": "-3"}, "N_GEN=-3 is too small"),
    ({"ITERA": "-1"}, "ITERA=-1 is too small"),
    ({"ITERA": "2.5"}, "ITERA='2.5' is not an integer"),
    ({"MAX_DEPTH": "-1"}, "MAX_DEPTH=-1 is too small"),
    ({"MAX_TOKEN_LENGTH": "10"}, "MAX_TOKEN_LENGTH=10 is too small"),
    ({"TEMP": "-0.5"}, "TEMP=-0.5 is too small"),
    ({"TEMP": "nan"}, "TEMP='nan' is not a number"),
])
def test_search_values(tmp_path, env, needle):
    """A search knob out of range or of the wrong type is named in one line; no output folder is made."""
    res = run_script("mcts_collection.py", "--env_server_base", NOWHERE, "--backend", SEARCH_DOUBLE,
                     "--model_name", "m", "--output_dir", tmp_path / "out", env={"TASK": "textcraft", **env})
    one_line_error(res, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content,needle", [
    ('{"item_id": "textcraft_1"}', "must be a JSON list"),
    ('[{"item_id": "textcraft_1"}', "is not valid JSON"),
    ('[{"item_id": "textcraft_one"}]', "does not end in _<index>"),
    ('["textcraft_1"]', "entry 0: expected {\"item_id\""),
    ('[{"id": 3}]', "entry 0: expected {\"item_id\""),
])
@pytest.mark.parametrize("script", ["mcts_collection.py", "eval.py"])
def test_split_file_in_the_wrong_format(tmp_path, script, content, needle):
    """A split file of the wrong shape is named with what is wrong, before any server is asked."""
    split = tmp_path / "split.json"
    split.write_text(content)
    res = run_script(script, "--env_server_base", NOWHERE, "--backend", SEARCH_DOUBLE, "--split_file", split,
                     "--output_dir", tmp_path / "out", env={"TASK": "textcraft", "MODEL_NAME": "m"})
    one_line_error(res, f"split file {split}")
    assert needle in res.stderr
    assert not (tmp_path / "out").exists()
