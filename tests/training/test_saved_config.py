"""Every trained model is saved through agent_r.training.saving.save_model,
so that transformers 4.x readers (XTuner) load it as it was trained: its
config carries ``rope_theta`` (SmolLM2's is 100000; without the key 4.x
would rotate with 10000) and one dtype."""
from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from agent_r.training.saving import save_model


@pytest.mark.parametrize("theta", [100000.0, 10000.0, 500000.0])
def test_a_saved_model_keeps_its_rope_theta_for_transformers_4_readers(tmp_path, theta):
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, rope_theta=theta))
    source = tmp_path / "source"
    source.mkdir()
    save_model(model, source, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["rope_theta"] == theta
    assert (cfg.get("rope_parameters") or {}).get("rope_theta", theta) == theta     # 5.x's key agrees
