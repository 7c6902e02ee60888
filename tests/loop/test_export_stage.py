"""The loop's data stage fits every sample to MAX_LENGTH with the tokenizer of
the model being trained, before the trainer sees it. XTuner (and the CPU and
TRL trainers, which encode as it does) cut a longer sample from its end, and
the end of a revision sample is its trained part: unfitted, such a sample
would lose its trained turns. Fitting drops the oldest untrained history
instead, so every trained turn survives the trainer's cut."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import AutoTokenizer

from agent_r.loop import stages
from agent_r.loop.models import ModelPool, Policy
from agent_r.llm.chat import IGNORE, ChatFormat
from tests.loop.conftest import FLAGS, SMALL, settings_for
from tests.support import tree_fixtures as tf

MAX_LENGTH = 300   # below the longest samples of these trees (~360 tokens), above their trained parts


def export(base_model: str, folder: Path, max_length: int) -> list[dict]:
    """The direct variant's export of four fixture trees, through the data stage."""
    s = settings_for({**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "VARIANTS": "direct",
                      "MAX_LENGTH": str(max_length)}, FLAGS)
    p = Policy("base", base_model, s.backend)
    trees = folder / "trees"
    out = stages.search_settings(s, "textcraft", trees, p).out_dir()
    for idx, tree in enumerate([tf.tree_many_leaves(), tf.tree_shared_prefix(), tf.tree_disaster(),
                                tf.tree_split_at_root()]):
        tf.write_tree(tree, out, idx)
    train_file = folder / "data" / "train.json"
    stages.data_stage(s, ModelPool(s.seed, 8000), trees, folder / "data", "direct", p, train_file)
    return json.loads(train_file.read_text())


def trained_turns(sample: dict) -> list[str]:
    return [m["content"] for m in sample["messages"] if m["role"] == "assistant" and m.get("loss")]


def test_the_data_stage_fits_samples_so_no_trained_turn_is_cut(base_model, tmp_path, caplog):
    fmt = ChatFormat(AutoTokenizer.from_pretrained(base_model))   # how every trainer encodes a sample
    whole = export(base_model, tmp_path / "whole", 100_000)
    lengths = [len(fmt.encode(s["messages"], 10**9)[0]) for s in whole]
    assert max(lengths) > MAX_LENGTH                      # as collected, some samples are too long

    with caplog.at_level(logging.INFO, logger="agent_r.loop.stages"):
        fitted = export(base_model, tmp_path / "fitted", MAX_LENGTH)
    assert "4 shortened by dropping" in caplog.text
    for sample in fitted:
        ids, labels = fmt.encode(sample["messages"], 10**9)
        assert len(ids) <= MAX_LENGTH                      # the trainer's cut at MAX_LENGTH takes nothing
        assert labels[-1] != IGNORE                        # a sample still ends on its trained turn
    assert [trained_turns(s) for s in fitted] == [trained_turns(s) for s in whole]
