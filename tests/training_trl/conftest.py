"""Fixtures for the TRL trainer tests: a real export (path_collection's
export code on revision and good rows of the fixture trees), general chat
data, and helpers that run the tiny model through real TRL.

Nothing here is a double except the verifier that judges steps while the
revision rows are built (the same scripted verifier the export tests
use, tests/support/export_rows.py); the export, the encoding, TRL and XTuner are the real code.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r import export
from agent_r.training import trl_sft
from tests.support import tree_fixtures as tf
from tests.support.export_rows import good_rows, revision_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def trl_export(tmp_path_factory) -> Path:
    """``path_collection.py export --format xtuner`` output (written by the
    export code, no tokenizer: nothing fitted, so XTuner cuts long samples):
    revision samples with loss-false bad prefixes and good samples."""
    work = tmp_path_factory.mktemp("trl_export")
    revisions = (revision_rows(tf.tree_many_leaves(), {"get 1 diamond": "Bad"})
                 + revision_rows(tf.tree_shared_prefix(), None, idx=1)
                 + revision_rows(tf.tree_disaster(), None, idx=2))
    goods = good_rows(tf.tree_many_leaves()) + good_rows(tf.tree_split_at_root(), idx=3)
    centric = write_jsonl(work / "textcraft_centric.jsonl", revisions)
    good = write_jsonl(work / "textcraft_good.jsonl", goods)
    out = work / "train.json"
    export.write_export(export.ExportSettings(format="xtuner", input=[str(centric), str(good)], output=str(out)))
    return out


@pytest.fixture(scope="session")
def general_file(tmp_path_factory) -> Path:
    """ShareGPT-style general data: 12 usable conversations and one the loader skips."""
    convs = [{"conversations": [{"from": "human", "value": f"What is {i} plus {i}?"},
                                {"from": "gpt", "value": f"{i} plus {i} is {2 * i}."}]} for i in range(12)]
    convs.append({"conversations": [{"from": "bard", "value": "?"}]})
    path = tmp_path_factory.mktemp("general") / "sharegpt.json"
    path.write_text(json.dumps(convs))
    return path


def quick(**knobs) -> trl_sft.TrlConfig:
    """A CPU-sized config: fp32, one thread, no warm-up unless asked, no checkpoints."""
    base = dict(lr=1e-3, epochs=1, max_length=512, batch_size=2, accumulative_counts=1, warmup_ratio=0.0,
                precision="fp32", gradient_checkpointing="0", save_steps=10_000, threads=1, general_data="", eta=0.0)
    return trl_sft.TrlConfig(**{**base, **knobs})
