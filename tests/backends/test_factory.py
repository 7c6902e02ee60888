"""make_backend: from the scripts' backend settings (flag > env var >
default) to a ready backend, announced in one start-up line."""
from __future__ import annotations

import json
import logging

import pytest

from agent_r.knobs import BackendSettings
from agent_r.llm import GenerationRequest, HFBackend, OpenAIBackend, make_backend
from agent_r.settings import UsageError, manifest_config, parse
from tests.backends.common import GREEDY, SECRET, numbered_chat
from tests.support.doubles import ScriptedBackend


def backend_settings(**environ) -> BackendSettings:
    return parse(BackendSettings, argv=[], environ=environ)


def test_make_backend_reads_openai_env(openai_server, tiny_model_dir, hf):
    """BACKEND=openai takes the endpoint, key, served name and concurrency
    from the environment and the tokenizer from MODEL_DIR; the key is never
    in the manifest config."""
    settings = backend_settings(BACKEND="openai", OPENAI_BASE_URL=openai_server, OPENAI_API_KEY=SECRET,
                                MODEL_NAME="tiny-served", MODEL_DIR=tiny_model_dir, OPENAI_CONCURRENCY="2")
    backend = make_backend(settings, seed=3)
    assert isinstance(backend, OpenAIBackend)
    assert backend.describe()["model"] == "tiny-served" and backend.max_concurrency == 2
    assert SECRET not in json.dumps(manifest_config(settings))
    assert backend.count_tokens(numbered_chat(0)) == hf.count_tokens(numbered_chat(0))  # tokenizer from MODEL_DIR
    assert backend.generate([GenerationRequest(numbered_chat(0))], GREEDY) == hf.generate(
        [GenerationRequest(numbered_chat(0))], GREEDY)


def test_make_backend_hf_default_and_user_factory(monkeypatch, tiny_model_dir, policy_file):
    """No backend named and vllm unusable -> hf with the settings' batch
    size; python:MODULE:FACTORY builds the user's backend from model_dir."""
    monkeypatch.setattr("agent_r.llm.factory._vllm_usable", lambda: False)
    hf = make_backend(BackendSettings(model_dir=tiny_model_dir, hf_batch_size=2), seed=1)
    assert isinstance(hf, HFBackend) and hf.batch_size == 2
    user = make_backend(BackendSettings(backend="python:tests.support.doubles:table_backend", model_dir=policy_file),
                        seed=1)
    assert isinstance(user, ScriptedBackend)
    assert user.generate([GenerationRequest(numbered_chat(5), n=2)], GREEDY) == [["Action: inventory", "Action: wait"]]


def test_make_backend_unknown_kind_lists_choices(tiny_model_dir):
    """An unknown kind names itself and every valid choice; a malformed,
    unimportable or missing python: factory is a usage error too."""
    with pytest.raises(UsageError) as err:
        make_backend(BackendSettings(backend="vlm", model_dir=tiny_model_dir))
    msg = str(err.value)
    assert "'vlm'" in msg and all(k in msg for k in ("vllm", "openai", "hf", "python:MODULE:FACTORY"))
    for bad in ("python:nope", "python:tests.support.no_such_module:f", "python:tests.support.doubles:missing"):
        with pytest.raises(UsageError):
            make_backend(BackendSettings(backend=bad, model_dir=tiny_model_dir))


def test_user_factory_must_return_a_backend(tiny_model_dir):
    """A python: factory that returns something else than a Backend is a
    usage error naming what it returned."""
    with pytest.raises(UsageError, match="not_a_backend returned dict, not an agent_r.llm.Backend"):
        make_backend(BackendSettings(backend="python:tests.backends.test_factory:not_a_backend",
                                     model_dir=tiny_model_dir))


def not_a_backend(model_dir, **options):
    """A python: factory for the test above: returns a dict."""
    return {"model_dir": model_dir}


def test_startup_line_names_backend_device_dtype(tiny_model_dir, vllm_fake, caplog):
    """Each built-in backend logs one "model: ..." line saying what runs
    where: backend, device, dtype, model and size (the server's for openai).
    On CPU vllm's "auto" dtype is float32 (vllm's own auto is bf16 there, which
    changes greedy episodes); an explicit dtype reaches the engine as given."""
    with caplog.at_level(logging.INFO, logger="agent_r.llm"):
        make_backend(BackendSettings(backend="hf", model_dir=tiny_model_dir))
        make_backend(BackendSettings(backend="vllm", model_dir=tiny_model_dir), max_model_len=1000)
        make_backend(BackendSettings(backend="vllm", model_dir=tiny_model_dir, dtype="bfloat16"), max_model_len=1000)
        make_backend(BackendSettings(backend="openai", model_dir=tiny_model_dir,
                                     openai_base_url="http://127.0.0.1:9/v1"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model: ")]
    assert len(lines) == 4
    assert "backend hf | device cpu | dtype float32 | model_dir " in lines[0] and "parameters" in lines[0]
    assert "backend vllm" in lines[1] and "device cpu" in lines[1] and "dtype float32" in lines[1]
    assert "max_model_len 1000" in lines[1]
    assert "dtype bfloat16" in lines[2]
    assert "backend openai" in lines[3] and "device and dtype: the server's" in lines[3]


def test_allow_cpu_and_kv_cache_settings_parse():
    """--allow_cpu / ALLOW_CPU and --kv_cache_gib parse; a dtype outside the
    choices is a usage error listing them."""
    assert parse(BackendSettings, [], {"ALLOW_CPU": "1"}).allow_cpu is True
    assert parse(BackendSettings, ["--allow_cpu", "1"], {}).allow_cpu is True
    assert parse(BackendSettings, [], {}).allow_cpu is False
    assert parse(BackendSettings, ["--kv_cache_gib", "0.5"], {}).kv_cache_gib == 0.5
    with pytest.raises(UsageError, match="--dtype='fp8' is not one of auto"):
        parse(BackendSettings, ["--dtype", "fp8"], {})
