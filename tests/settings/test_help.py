"""Every script's --help names every setting it reads (each flag and each
environment variable, nested groups included), and its manifest config holds
every setting."""
from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
import typing

import pytest

from agent_r.settings import manifest_config, parse
from tests.support.env_fixtures import ROOT

# (script, "module:SettingsClass") of every script that parses settings
SCRIPTS = [
    ("mcts_collection.py", "agent_r.search:SearchSettings"),
    ("eval.py", "agent_r.evaluation:EvalSettings"),
    ("path_collection.py", "agent_r.revision_data:PathSettings"),
    ("iterate.py", "agent_r.loop.settings:IterateSettings"),
]


def settings_class(spec: str) -> type:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def leaf_fields(cls: type) -> list[dataclasses.Field]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("nested"):
            out += leaf_fields(hints[f.name])
        else:
            out.append(f)
    return out


def flatten(config: dict) -> dict:
    """A manifest config with its nested groups' values lifted to the top."""
    out = {}
    for key, value in config.items():
        out.update(flatten(value) if isinstance(value, dict) else {key: value})
    return out


def flag_of(f: dataclasses.Field) -> str | None:
    flag = f.metadata.get("flag")
    return f"--{f.name}" if flag is True else flag


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
    flat = flatten(config)
    assert {f.name for f in leaf_fields(cls)} <= set(flat)


def script_help(script: str) -> str:
    res = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return " ".join(res.stdout.split())


@pytest.mark.parametrize("script,spec", SCRIPTS)
def test_help_names_every_exit_code(script, spec):
    """The one exit-code rule of run_cli, 130 (interrupted) included."""
    from agent_r.settings import EXIT_INTERRUPTED, EXIT_ITEMS_FAILED, EXIT_OK, EXIT_USAGE

    text = script_help(script)
    for code in (EXIT_OK, EXIT_ITEMS_FAILED, EXIT_USAGE, EXIT_INTERRUPTED):
        assert f" {code} " in text, f"{script} --help does not name exit code {code}"
    assert "130 interrupted" in text


def test_evals_help_compares_the_folders_its_own_examples_make():
    """--help's --compare example names the folders its first and third
    commands write, not folders eval.py never makes."""
    from agent_r.evaluation import EvalSettings
    from agent_r.paths import eval_dir

    text = script_help("eval.py")
    made = [eval_dir(parse(EvalSettings, [], {"TASK": "textcraft"})),
            eval_dir(parse(EvalSettings, [], {"TASK": "textcraft", "MODEL_DIR": "models/my-model",
                                              "MODEL_TYPE": "iter1"}))]
    assert f"--compare {made[0].as_posix()} {made[1].as_posix()} \\ --plot" in text


def test_iterates_help_names_the_model_it_runs():
    """The example's run name says which model it trains, and the command sets that model."""
    text = script_help("iterate.py")
    assert "MODEL_DIR=/models/Llama-3.1-8B-Instruct \\ python iterate.py --name llama-textcraft" in text
