"""Rows for the export tests: path_collection rows made by the real revision
code from hand-built trees (``revision_rows``, ``good_rows``), minimal rows
(``rows``, ``HEAD``), and the check every XTuner sample must pass."""
from __future__ import annotations

import json
from pathlib import Path

from agent_r import revision
from agent_r.revision_data import PathSettings
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend


def revision_rows(root, verifier_labels=None, idx=0):
    cfg = PathSettings(task="textcraft", alpha=0.5, beta=0.5, revise=verifier_labels is not None).revision_config()
    backend = ScriptedBackend(tf.verifier_policy(verifier_labels or {}))
    return revision.process_trees([revision.plan_tree(idx, root, cfg)], cfg, backend)[0].rows


def good_rows(root, idx=0):
    cfg = PathSettings(task="textcraft", alpha=0.5, beta=0.5, data_type="good").revision_config()
    return revision.process_trees([revision.plan_tree(idx, root, cfg)], cfg, None)[0].rows


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_xtuner_sample_ok(sample, bad_turns=()):
    """Every assistant message has a boolean loss; system/user have none; no
    trained turn is one of the bad prefix's turns."""
    for m in sample["messages"]:
        if m["role"] == "assistant":
            assert isinstance(m["loss"], bool)
            if m["loss"]:
                assert m["content"] not in bad_turns
        else:
            assert "loss" not in m
    assert sample["messages"][2] == {"role": "assistant", "content": "Ok.", "loss": False}


HEAD = [{"role": "system", "content": "s"}, {"role": "user", "content": "i"},
        {"role": "assistant", "content": "Ok.", "loss": False}, {"role": "user", "content": "task"}]


def rows(n_rev: int, n_good: int) -> tuple[list[dict], list[dict]]:
    rev = [{"task_num": str(i), "revise_log": HEAD + [{"role": "assistant", "content": f"r{i}", "loss": True}],
            "high_log": HEAD, "low_log": HEAD} for i in range(n_rev)]
    good = [{"task_num": str(i), "revise_log": HEAD + [{"role": "assistant", "content": f"g{i}", "loss": True}]}
            for i in range(n_good)]
    return rev, good
