"""Parsing settings (agent_r/settings.py): a flag wins over its environment
variable, which wins over the default; per-task defaults follow TASK; a bad
value is one sentence naming the setting; secrets never reach a manifest;
settings built in code get the same checks; one flag per setting."""
from __future__ import annotations

import pytest

from agent_r.knobs import BackendSettings
from agent_r.settings import UsageError, build_parser, manifest_config, parse, validate


def test_precedence_flag_over_env_over_default():
    from agent_r.search import SearchSettings

    assert parse(SearchSettings, [], {}).iterations == 8
    assert parse(SearchSettings, [], {"ITERA": "3"}).iterations == 3
    assert parse(SearchSettings, ["--model_name", "flag"], {"MODEL_NAME": "env"}).backend.model_name == "flag"
    assert parse(SearchSettings, [], {"MODEL_NAME": "env"}).backend.model_name == "env"
    assert parse(SearchSettings, [], {"MODEL_NAME": "  "}).backend.model_name is None   # blank = unset
    assert parse(SearchSettings, ["--concurrency", "3"], {}).concurrency == 3


def test_per_environment_defaults_follow_task():
    from agent_r.search import SearchSettings

    assert parse(SearchSettings, [], {}).max_depth == 20
    assert parse(SearchSettings, [], {"TASK": "SciWorld"}).max_depth == 30
    assert parse(SearchSettings, [], {"TASK": "sciworld", "MAX_DEPTH": "7"}).max_depth == 7


@pytest.mark.parametrize("argv,environ,message", [
    ([], {"ITERA": "many"}, "ITERA='many' is not an integer: it is the number of MCTS iterations per tree."),
    ([], {"TEMP": "nan"}, "TEMP='nan' is not a number: it is the sampling temperature."),
    ([], {"N_GEN": "0"}, "N_GEN=0 is too small: it is the number of model samples per expansion"),
    (["--concurrency", "0"], {}, "--concurrency=0 is too small"),
    ([], {"TASK": "minecraft"}, "unknown TASK='minecraft'; choose one of: sciworld, textcraft, webshop"),
    ([], {"MAX_TOKEN_LENGTH": "61"}, "MAX_TOKEN_LENGTH=61 is too small"),
])
def test_validation_is_one_sentence_naming_the_setting(argv, environ, message):
    from agent_r.search import SearchSettings

    with pytest.raises(UsageError) as err:
        parse(SearchSettings, argv, environ)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_secret_never_appears_in_errors_or_manifest():
    settings = parse(BackendSettings, [], {"OPENAI_API_KEY": "sk-planted", "OPENAI_TIMEOUT": "2"})
    assert settings.openai_api_key == "sk-planted"
    assert "sk-planted" not in repr(manifest_config(settings))


def test_validate_checks_settings_built_in_code():
    from agent_r.search import SearchSettings

    with pytest.raises(UsageError, match="--concurrency=0 is too small"):
        validate(SearchSettings(concurrency=0))


def test_parser_has_one_flag_per_setting():
    from agent_r.search import SearchSettings

    flags = [a.option_strings[0] for a in build_parser(SearchSettings, "").\
             _actions if a.option_strings and a.dest != "help"]
    assert len(flags) == len(set(flags))
