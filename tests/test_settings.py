"""The one settings path (agent_r/settings.py): precedence, validation
messages, help text and manifest, for every script's settings class."""
from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys

import pytest

from agent_r.settings import BackendSettings, UsageError, build_parser, manifest_config, parse, validate
from tests.support.env_fixtures import ROOT

# (script, "module:SettingsClass") of every script that parses settings
SCRIPTS = [
    ("mcts_collection.py", "agent_r.search:SearchSettings"),
    ("eval.py", "agent_r.evaluation:EvalSettings"),
    ("path_collection.py", "agent_r.revision_data:PathSettings"),
]


def settings_class(spec: str) -> type:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def leaf_fields(cls: type) -> list[dataclasses.Field]:
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            out += leaf_fields(BackendSettings)
        else:
            out.append(f)
    return out


def flag_of(f: dataclasses.Field) -> str | None:
    flag = f.metadata.get("flag")
    return f"--{f.name}" if flag is True else flag


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


@pytest.mark.parametrize("script,spec", SCRIPTS)
def test_help_lists_every_setting_and_manifest_has_every_setting(script, spec):
    cls = settings_class(spec)
    res = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    for f in leaf_fields(cls):
        names = [n for n in (flag_of(f), f.metadata.get("env")) if n]
        assert names, f"{cls.__name__}.{f.name} can be set neither by flag nor by env var"
        for name in names:
            assert name in res.stdout, f"{script} --help does not mention {name}"
    config = manifest_config(parse(cls, [], {"TASK": "textcraft"}))
    flat = {**config, **config.get("backend", {})}
    assert {f.name for f in leaf_fields(cls)} <= set(flat)


def test_parser_has_one_flag_per_setting():
    from agent_r.search import SearchSettings

    flags = [a.option_strings[0] for a in build_parser(SearchSettings, "").\
             _actions if a.option_strings and a.dest != "help"]
    assert len(flags) == len(set(flags))


def test_training_settings_parse_from_env():
    from xtuner_config.settings import TrainSettings

    s = parse(TrainSettings, [], {"LR": "1e-5", "PACK": "0", "WORK_DIR": ""})
    assert (s.lr, s.pack, s.work_dir, s.epochs) == (1e-5, False, None, 3)
    with pytest.raises(UsageError, match="EPOCHS=0 is too small: it is the number of training epochs"):
        parse(TrainSettings, [], {"EPOCHS": "0"})
