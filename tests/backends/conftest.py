"""Fixtures of the backend tests: a tiny model under hf, model directories
shaped to reach a limit cheaply, the fake vLLM engine, a policy table."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_r.llm import HFBackend
from tests.support import fake_vllm


@pytest.fixture(scope="module")
def hf(tiny_model_dir) -> HFBackend:
    """The tiny model under hf on CPU, shared by a test module."""
    return HFBackend(tiny_model_dir, device="cpu", batch_size=16)


@pytest.fixture(scope="module")
def short_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with only 256 positions, so 'too long' is cheap to reach."""
    path = tmp_path_factory.mktemp("short") / "model"
    shutil.copytree(tiny_model_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["max_position_embeddings"] = 256
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture()
def big_model_dir(tiny_model_dir, tmp_path) -> str:
    """A config of a ~1.2B Llama (no weights: nothing may load them) next to
    the tiny model's tokenizer files."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(tiny_model_dir) / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
        "vocab_size": 128256, "tie_word_embeddings": True, "max_position_embeddings": 131072}))
    return str(tmp_path)


@pytest.fixture()
def vllm_fake(monkeypatch):
    """The fake ``vllm`` module (a test double of the engine) as ``import vllm``, on a CPU platform."""
    return fake_vllm.install(monkeypatch, device="cpu")


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory) -> str:
    """A policy table for the scripted test double and the scripted OpenAI server."""
    path = tmp_path_factory.mktemp("policy") / "table.json"
    path.write_text(json.dumps({"Goal: craft item 1": ["Thought: one\nAction: get 1 oak log"],
                                "default": ["Action: inventory", "Action: wait", "Thought: hmm\nAction: look"]}))
    return str(path)
