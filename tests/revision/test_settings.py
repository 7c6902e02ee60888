"""path_collection.py's settings: flag over env var over default, per-task
ALPHA/BETA and the default input folder, and one-line errors for bad values."""
from pathlib import Path

import pytest

from agent_r.revision_data import PathSettings
from agent_r.settings import UsageError, parse


def test_settings_precedence_and_per_task_defaults():
    env = {"TASK": "textcraft", "TEMP": "0.3", "MODEL_NAME": "my-model"}
    assert parse(PathSettings, ["--verifier_temperature", "0.7"], env).verifier_temperature == 0.7
    s = parse(PathSettings, [], env)
    assert s.verifier_temperature == 0.3 and s.input_dir == str(Path("mcts_result") / "textcraft" / "my-model")
    assert parse(PathSettings, [], {"TASK": "textcraft"}).verifier_temperature == 0.0
    sci = parse(PathSettings, [], {"TASK": "SciWorld", "BETA": "10"})
    assert (sci.task, sci.alpha, sci.beta) == ("sciworld", 50.0, 10.0)
    cfg = parse(PathSettings, ["--revise", "0", "--data_type", "good"], {"TASK": "webshop"}).revision_config()
    assert (cfg.alpha, cfg.beta, cfg.revise, cfg.data_type, cfg.max_token_length) == (0.5, 0.3, False, "good", 4096)


@pytest.mark.parametrize("argv,env,needle", [
    ([], {}, "TASK is not set"),
    ([], {"TASK": "textcraft", "MAX_TOKEN_LENGTH": "99"}, "MAX_TOKEN_LENGTH=99 is too small"),
    (["--data_type", "bad"], {"TASK": "textcraft"}, "--data_type='bad' is not one of centric, good"),
    (["--revise", "2"], {"TASK": "textcraft"}, "--revise='2' is not 0 or 1"),
    (["--max_pairs_per_tree", "-1"], {"TASK": "textcraft"}, "--max_pairs_per_tree=-1 is too small"),
    (["--verifier_temperature", "-1"], {"TASK": "textcraft"}, "--verifier_temperature=-1.0 is too small"),
    (["--tree_batch", "0"], {"TASK": "textcraft"}, "--tree_batch=0 is too small"),
])
def test_settings_errors_are_one_line(argv, env, needle):
    with pytest.raises(UsageError) as info:
        parse(PathSettings, argv, env)
    assert needle in str(info.value) and "\n" not in str(info.value)
