"""GENERAL_DATA beyond ShareGPT: a model's own training conversations (this
project's ``{"messages": [...]}`` rows with loss flags, JSON or JSON Lines),
several files comma-separated. What a tiny model trained from scratch replays
in place of the paper's ShareGPT."""
from __future__ import annotations

import json

import pytest

from agent_r.settings import UsageError
from agent_r.training.data import load_general_samples, training_records


def own(i: int, trained_ok: bool = False) -> dict:
    return {"task_num": i, "messages": [
        {"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": f"Goal {i}"},
        {"role": "assistant", "content": "Ok.", "loss": trained_ok}, {"role": "user", "content": "obs"},
        {"role": "assistant", "content": f"Action: get {i} oak log", "loss": True}]}


def test_own_conversations_keep_their_loss_flags_and_files_add_up(tmp_path):
    jsonl = tmp_path / "policy.jsonl"
    jsonl.write_text("".join(json.dumps(own(i)) + "\n" for i in range(3)))
    sharegpt = tmp_path / "chat.json"
    sharegpt.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
                                    {"messages": [{"role": "user", "content": "only a question"}]}]))   # skipped
    samples = load_general_samples(f"{jsonl}, {sharegpt}")
    assert len(samples) == 4
    first = samples[0]["messages"]
    assert [m.get("loss") for m in first] == [None, None, False, None, True]   # "Ok." stays untrained
    assert "task_num" not in samples[0]
    assert samples[3]["messages"][-1] == {"role": "assistant", "content": "a", "loss": True}


def test_eta_counts_general_samples_per_agent_sample(tmp_path):
    general = tmp_path / "general.jsonl"
    general.write_text("".join(json.dumps(own(i)) + "\n" for i in range(50)))
    agent = tmp_path / "train.json"
    agent.write_text(json.dumps([{"messages": own(100 + i)["messages"]}
                                 for i in range(20)]))
    rows, n_agent = training_records([str(agent)], str(general), 0.2, seed=0)
    assert n_agent == 20 and len(rows) == 24                       # 0.2 x 20 general conversations
    rows, _ = training_records([str(agent)], str(general), 0.0, seed=0)
    assert len(rows) == 20


def test_unreadable_general_data_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n{not json\n')
    with pytest.raises(UsageError, match="neither JSON nor JSON Lines"):
        load_general_samples(str(bad))
    with pytest.raises(UsageError, match="does not exist"):
        load_general_samples(str(tmp_path / "missing.jsonl"))
