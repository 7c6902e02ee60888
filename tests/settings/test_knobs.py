"""Knob groups (agent_r/knobs.py, agent_r/training/settings.py): every
environment variable is declared by one field with one default, every script
keeps the fallbacks it promises (TEMP, MAX_TOKEN_LENGTH, TASK, MODEL_DIR), and
the loop hands each stage the values the stage's own script would read from
the same environment."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from agent_r.evaluation import EvalSettings
from agent_r.export import ExportSettings
from agent_r.knobs import BUNDLED_MODEL_DIR, BackendSettings
from agent_r.loop.models import Policy
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stages import eval_settings, path_settings, search_settings
from agent_r.revision_data import PathSettings
from agent_r.search import SearchSettings
from agent_r.settings import UsageError, parse
from agent_r.training.eto import EtoConfig, PairsCommand, TrainCommand
from agent_r.training.settings import TrainSettings
from agent_r.training.trl_sft import TrlCommand, TrlConfig

EVERY_SETTINGS_CLASS = (SearchSettings, PathSettings, EvalSettings, ExportSettings, IterateSettings, TrainSettings,
                        TrlCommand, PairsCommand, TrainCommand)


def declarations(cls: type) -> list[dataclasses.Field]:
    """The fields a settings class reads, its nested groups' included."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        out += declarations(hints[f.name]) if f.metadata.get("nested") else [f]
    return out


def test_every_environment_variable_is_declared_once():
    by_env: dict[str, set[int]] = {}
    fields: dict[int, dataclasses.Field] = {}
    for cls in EVERY_SETTINGS_CLASS:
        for f in declarations(cls):
            if f.metadata.get("env"):
                by_env.setdefault(f.metadata["env"], set()).add(id(f))
                fields[id(f)] = f
    twice = {env: sorted(fields[i].name for i in ids) for env, ids in by_env.items() if len(ids) > 1}
    assert not twice, f"environment variables declared by more than one field: {twice}"
    # the knobs several scripts read are among them, each still read by every script that read it
    shared = {"TASK": (SearchSettings, PathSettings, EvalSettings, IterateSettings, PairsCommand),
              "TEMP": (SearchSettings, PathSettings, EvalSettings, IterateSettings),
              "MAX_TOKEN_LENGTH": (SearchSettings, PathSettings, EvalSettings, IterateSettings),
              "MAX_DEPTH": (SearchSettings, IterateSettings), "ITERA": (SearchSettings, IterateSettings),
              "N_GEN": (SearchSettings, IterateSettings), "ALPHA": (PathSettings, IterateSettings),
              "BETA": (PathSettings, IterateSettings),
              "WAIT_REPLY": (EvalSettings, IterateSettings), "EVAL_SAMPLES": (EvalSettings, IterateSettings),
              "MAX_LENGTH": (ExportSettings, TrainSettings, IterateSettings, TrlConfig, EtoConfig),
              "MODEL_DIR": (SearchSettings, PathSettings, EvalSettings, IterateSettings, TrainSettings, TrlCommand,
                            TrainCommand),
              **{env: (TrainSettings, IterateSettings, TrlConfig) for env in ("GENERAL_DATA", "ETA", "LR", "EPOCHS")},
              **{env: (TrainSettings, IterateSettings, TrlConfig, EtoConfig)
                 for env in ("BATCH_SIZE", "ACCUMULATIVE_COUNTS", "WARMUP_RATIO")},
              "SEED": (TrainSettings, TrlConfig, EtoConfig),
              **{env: (TrainSettings, IterateSettings, TrlConfig, EtoConfig)
                 for env in ("SAVE_STEPS", "SAVE_TOTAL_LIMIT")},
              **{env: (IterateSettings, TrlConfig, EtoConfig)
                 for env in ("LR_SCHEDULER", "WEIGHT_DECAY", "MAX_GRAD_NORM", "PRECISION", "GRADIENT_CHECKPOINTING",
                             "SAVE_DTYPE", "REPORT_TO", "LOGGING_STEPS")},
              **{env: (IterateSettings, EtoConfig) for env in ("ETO_BETA", "ETO_LR", "ETO_EPOCHS")}}
    for env, readers in shared.items():
        for cls in readers:
            assert env in {f.metadata.get("env") for f in declarations(cls)}, f"{cls.__name__} no longer reads {env}"


def test_each_script_keeps_its_temperature_and_prompt_budget_fallbacks():
    """TEMP unset: the policy samples at 1.0 in search and eval, the verifier
    is greedy; TEMP set reaches all three. MAX_TOKEN_LENGTH unset: 4096 for
    search and the verifier, 7000 for eval."""
    task = {"TASK": "textcraft"}
    unset = [parse(cls, [], task) for cls in (SearchSettings, EvalSettings, PathSettings)]
    assert [unset[0].temperature, unset[1].temperature, unset[2].verifier_temperature] == [1.0, 1.0, 0.0]
    assert [s.max_token_length for s in unset] == [4096, 7000, 4096]
    hot = {**task, "TEMP": "0.3", "MAX_TOKEN_LENGTH": "3000"}
    given = [parse(cls, [], hot) for cls in (SearchSettings, EvalSettings, PathSettings)]
    assert [given[0].temperature, given[1].temperature, given[2].verifier_temperature] == [0.3, 0.3, 0.3]
    assert [s.max_token_length for s in given] == [3000, 3000, 3000]
    assert parse(PathSettings, ["--verifier_temperature", "0.7"], hot).verifier_temperature == 0.7


def test_task_and_model_dir_fallbacks():
    assert parse(SearchSettings, [], {}).task == "textcraft"
    assert parse(IterateSettings, [], {}).tasks == ["textcraft"]
    for cls in (PathSettings, EvalSettings):
        with pytest.raises(UsageError, match="TASK is not set"):
            parse(cls, [], {})
    assert parse(BackendSettings, [], {}).model_dir is None            # the backend loads the bundled model
    assert parse(TrainSettings, [], {}).model_dir == str(BUNDLED_MODEL_DIR)   # and the trainer starts from it
    assert Path(BUNDLED_MODEL_DIR, "config.json").exists()
    assert parse(TrainSettings, [], {"MODEL_DIR": "/m"}).model_dir == "/m"


def test_training_settings_parse_from_env():
    s = parse(TrainSettings, [], {"LR": "1e-5", "PACK": "0", "WORK_DIR": ""})
    assert (s.lr, s.pack, s.work_dir, s.epochs) == (1e-5, False, None, 3)
    with pytest.raises(UsageError, match="EPOCHS=0 is too small: it is the number of training epochs"):
        parse(TrainSettings, [], {"EPOCHS": "0"})


ENV = {"TASK": "sciworld", "ITERA": "3", "N_GEN": "2", "TEMP": "0.5", "ALPHA": "40", "BETA": "5",
       "MAX_TOKEN_LENGTH": "3000", "MAX_LENGTH": "2048"}
KNOBS = {"search": ("max_depth", "iterations", "n_gen", "temperature", "c", "max_token_length"),
         "pairs": ("alpha", "beta", "max_pairs_per_tree", "max_token_length")}


@pytest.mark.parametrize("search_flags, pair_flags", [([], []), (["--exploration_c", "0.5"],
                                                                     ["--max_pairs_per_tree", "2"])])
def test_the_loop_hands_each_stage_what_its_script_reads(search_flags, pair_flags, tmp_path):
    """For the same environment and flags, iterate.py's search and data stages
    get the knob values mcts_collection.py and path_collection.py parse (the
    per-task defaults resolved for the stage's task); its eval keeps eval's
    prompt budget when MAX_TOKEN_LENGTH is unset."""
    loop = parse(IterateSettings, search_flags + pair_flags, ENV)
    p = Policy("m", "m", loop.backend)
    searched = search_settings(loop, "sciworld", tmp_path, p)
    script = parse(SearchSettings, search_flags, ENV)
    assert {k: getattr(searched, k) for k in KNOBS["search"]} == {k: getattr(script, k) for k in KNOBS["search"]}
    assert searched.max_depth == 30 and searched.iterations == 3          # sciworld's depth, ITERA
    paired = path_settings(loop, "sciworld", tmp_path, tmp_path, "centric", True, p)
    script = parse(PathSettings, pair_flags, ENV)
    assert {k: getattr(paired, k) for k in KNOBS["pairs"]} == {k: getattr(script, k) for k in KNOBS["pairs"]}
    export = ["--format", "xtuner", "--input", "x.jsonl", "--output", "x.json"]
    assert loop.train.max_length == parse(ExportSettings, export, ENV).max_length == 2048
    unset = parse(IterateSettings, [], {k: v for k, v in ENV.items() if k != "MAX_TOKEN_LENGTH"})
    assert eval_settings(unset, "sciworld", tmp_path, p).max_token_length == 7000
    assert search_settings(unset, "sciworld", tmp_path, p).max_token_length == 4096
