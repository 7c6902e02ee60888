"""Fixtures of the loop tests: a tiny random Llama as the base model (really
fine-tuned and saved each iteration by the CPU trainer), the real local
TextCraft server, and small settings so a whole run takes seconds."""
from __future__ import annotations

from pathlib import Path

import pytest

from agent_r.loop import IterateSettings
from agent_r.settings import parse
from tests.loop.doubles import DOUBLE
from tests.support.model_fixtures import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(ITERA="3", N_GEN="3", MAX_DEPTH="4", TEMP="1.0", ITERATIONS="2", VARIANTS="agent-r,direct,good",
             EPOCHS="1", LR="1e-3", ACCUMULATIVE_COUNTS="1", WARMUP_RATIO="0", MAX_LENGTH="1024",
             TRAINER="cpu", BACKEND=DOUBLE)
FLAGS = ["--min", "1", "--max", "5", "--eval_limit", "3", "--eval_max_steps", "4", "--revise_limit", "2",
         "--max_new_tokens", "40", "--concurrency", "2", "--max_pairs_per_tree", "3"]


def settings_for(env: dict[str, str], flags: list[str]) -> IterateSettings:
    return parse(IterateSettings, flags, environ=env)


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without wall times."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.fixture(scope="session")
def base_model(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("iterate_base") / "model", seed=3)


@pytest.fixture(scope="session")
def small_env(base_model, textcraft_server) -> dict[str, str]:
    return {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model}
