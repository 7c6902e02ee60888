"""What a model directory tells before any weights load: which directory
MODEL_DIR means, the model's name in output paths, its positions (the vLLM
engine's length), its size, and whether it may run on CPU."""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from agent_r.knobs import BackendSettings
from agent_r.llm import BUNDLED_MODEL, HFBackend, engine_max_model_len, make_backend, parameter_count, resolve_model_dir
from agent_r.settings import UsageError, parse


def test_resolve_model_dir(monkeypatch, tmp_path, tiny_model_dir):
    """An existing path is kept, a hub id passes unchanged, a missing path
    is a usage error saying what MODEL_DIR must hold; unset means the
    bundled model, and a missing bundled model says to set MODEL_DIR."""
    assert resolve_model_dir(tiny_model_dir) == tiny_model_dir
    assert resolve_model_dir("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    missing = str(tmp_path / "no" / "model")
    with pytest.raises(UsageError) as err:
        resolve_model_dir(missing)
    assert "MODEL_DIR" in str(err.value) and missing in str(err.value) and "config.json" in str(err.value)
    monkeypatch.setattr("agent_r.llm.model_files.BUNDLED_MODEL", tmp_path / "models" / "textcraft-tiny")
    with pytest.raises(UsageError) as err:
        resolve_model_dir(None)
    assert "MODEL_DIR is not set" in str(err.value)
    monkeypatch.setattr("agent_r.llm.model_files.BUNDLED_MODEL", Path(tiny_model_dir))
    assert resolve_model_dir("") == tiny_model_dir


def test_bundled_model_is_the_repositorys():
    """The default model is models/textcraft-tiny of this repository."""
    root = Path(__file__).resolve().parents[2]
    assert BUNDLED_MODEL == root / "models" / "textcraft-tiny"
    assert resolve_model_dir(None) == str(BUNDLED_MODEL)


def test_model_name_precedence():
    """The name in output paths: --model_name > MODEL_NAME > the last part
    of MODEL_DIR (never resolved, so served names work) > the bundled model's."""
    from agent_r.search import SearchSettings

    name = lambda argv=(), **env: parse(SearchSettings, list(argv), env).model_name()  # noqa: E731
    assert name() == BUNDLED_MODEL.name
    assert name(MODEL_DIR="/models/Llama-3.1-8B-Instruct/") == "Llama-3.1-8B-Instruct"
    assert name(MODEL_DIR="served-name") == "served-name"  # never resolved: openai names work
    assert name(MODEL_DIR="/models/x", MODEL_NAME="iter1") == "iter1"
    assert name(["--model_name", "flag"], MODEL_DIR="/models/x", MODEL_NAME="iter1") == "flag"


def test_engine_length_is_capped_at_the_models_positions(tiny_model_dir, caplog):
    """The vLLM engine is as long as the run needs, capped (and said) at the
    model's positions; an explicit --max_model_len wins but may not exceed them."""
    with caplog.at_level(logging.INFO, logger="agent_r.llm"):
        assert engine_max_model_len(tiny_model_dir, None, 4096 + 60) == 4096
    assert "4096 (the model's positions), not 4156" in caplog.text
    assert engine_max_model_len(tiny_model_dir, None, 2000) == 2000
    assert engine_max_model_len(tiny_model_dir, 1024, 9000) == 1024
    with pytest.raises(UsageError, match=r"--max_model_len=8192 is above the model's 4096 positions"):
        engine_max_model_len(tiny_model_dir, 8192, None)


def test_parameter_count_is_exact_from_safetensors(tiny_model_dir):
    """The size read from safetensors headers equals the loaded model's."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert parameter_count(tiny_model_dir) == sum(p.numel() for p in model.parameters())


def test_big_model_on_cpu_is_refused_unless_allowed(big_model_dir, monkeypatch):
    """A >1B model with no usable GPU is refused with torch's own reason and
    the way out (--allow_cpu 1); allowed, it goes on to load."""
    import torch

    def too_old_driver() -> bool:
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version 11040).")
        return False

    monkeypatch.setattr(torch.cuda, "is_available", too_old_driver)
    assert 1.0e9 < parameter_count(big_model_dir) < 1.5e9
    with pytest.raises(UsageError) as err:
        make_backend(BackendSettings(backend="hf", model_dir=big_model_dir))
    msg = str(err.value)
    assert "1.2B-parameter model on CPU" in msg and "driver on your system is too old" in msg
    assert "--allow_cpu 1" in msg and "ALLOW_CPU=1" in msg
    with pytest.raises(OSError):   # allowed: it goes on to load the (absent) weights
        HFBackend(big_model_dir, allow_cpu=True)
