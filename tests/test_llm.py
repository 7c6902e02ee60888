"""Model backends against a real tiny model, a real local OpenAI-compatible
server (as a process) and the real openai client."""
from __future__ import annotations

import json
import logging
import sys

import pytest
import requests
from transformers import AutoTokenizer

from agent_r import llm
from agent_r.settings import BackendSettings, UsageError, manifest_config, parse
from agent_r.llm import (BackendError, GenerationRequest, HFBackend, OpenAIBackend, SamplingConfig, make_backend,
                         resolve_model_dir)
from tests.support.doubles import LatencyModelBackend, ScriptedBackend, table_backend
from tests.support.model_fixtures import free_port, start_openai_server

SECRET = "sk-PLANTED-secret-4f9c2e"
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=24)  # the scripted table replies the same at any temperature


def conversation(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Answer with Thought: ... Action: ..."},
        {"role": "assistant", "content": "Ok.", "loss": False},
        {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: craft item {i}." * (i + 1)},
    ]


@pytest.fixture(scope="module")
def hf(tiny_model_dir) -> HFBackend:
    return HFBackend(tiny_model_dir, device="cpu", batch_size=16)


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policy") / "table.json"
    path.write_text(json.dumps({"Goal: craft item 1": ["Thought: one\nAction: get 1 oak log"],
                                "default": ["Action: inventory", "Action: wait", "Thought: hmm\nAction: look"]}))
    return str(path)


# ----------------------------------------------------------------------------- hf

def test_hf_returns_n_samples_per_conversation(hf):
    before = hf.stats.as_dict()
    out = hf.generate([GenerationRequest(conversation(i), n=4) for i in range(3)],
                      SamplingConfig(temperature=1.0, max_new_tokens=16))
    assert [len(o) for o in out] == [4, 4, 4]
    assert all(isinstance(t, str) for o in out for t in o)
    assert len({t for o in out for t in o}) > 3  # sampling gives different texts
    after = hf.stats.as_dict()
    assert (after["calls"] - before["calls"], after["requests"] - before["requests"],
            after["samples"] - before["samples"]) == (1, 3, 12)


def test_hf_greedy_is_deterministic_and_batch_independent(tiny_model_dir, hf):
    batch = [GenerationRequest(conversation(i), n=1) for i in range(7)]
    batched = hf.generate(batch, GREEDY)
    again = hf.generate(batch, GREEDY)
    single = [hf.generate([GenerationRequest(conversation(i), n=1)], GREEDY)[0][0] for i in range(7)]
    assert batched == again
    for i in range(7):
        assert batched[i] == [single[i]]
    assert single[0] != single[1]
    chunked = HFBackend(tiny_model_dir, device="cpu", batch_size=3)  # 7 requests in chunks of 3
    assert chunked.generate(batch, GREEDY) == batched


def test_hf_seeded_sampling_reproducible_per_batch(hf):
    batch = [GenerationRequest(conversation(i), n=2, seed=100 + i) for i in range(2)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    assert hf.generate(batch, sampling) == hf.generate(batch, sampling)


def test_hf_generate_runs_without_cyclic_gc_and_restores_it(hf, monkeypatch):
    """A collection inside generate's decode loop scans the whole run's heap
    (bench/RESULTS.md: a fifth of the GPU's throughput); the collector is
    off for the call and back on after it, also when generate raises."""
    import gc
    seen, real = [], hf.model.generate

    def recording(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(hf.model, "generate", recording)
    assert gc.isenabled()
    hf.generate([GenerationRequest(conversation(0))], GREEDY)
    assert seen == [False] and gc.isenabled()

    def failing(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(hf.model, "generate", failing)
    with pytest.raises(RuntimeError):
        hf.generate([GenerationRequest(conversation(0))], GREEDY)
    assert gc.isenabled()


def test_hf_batch_size_auto_is_whole_call_on_gpu_16_on_cpu(tiny_model_dir):
    assert HFBackend(tiny_model_dir, device="cpu").batch_size == llm.CPU_HF_BATCH == 16
    assert BackendSettings().hf_batch_size == 0          # the scripts' default is auto


def test_hf_count_tokens_is_real_chat_prompt(tiny_model_dir, hf):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for i in range(3):
        msgs = conversation(i)
        plain = [{"role": m["role"], "content": m["content"]} for m in msgs]
        ids = tok.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert hf.count_tokens(msgs) == len(ids)
    assert hf.count_tokens(conversation(2)) > hf.count_tokens(conversation(0))


def test_hf_stop_string_cuts_output(hf):
    full = hf.generate([GenerationRequest(conversation(0))], GREEDY)[0][0]
    assert len(full) > 8
    stop = full[4:7]
    cut = hf.generate([GenerationRequest(conversation(0))], SamplingConfig(0.0, 24, stop=(stop,)))[0][0]
    assert cut == full[:full.index(stop)]
    assert stop not in cut


# ----------------------------------------------------------------------------- openai

def test_openai_returns_n_samples_and_matches_local_greedy(openai_server, tiny_model_dir, hf):
    backend = OpenAIBackend("tiny", openai_server, SECRET, max_concurrency=4, tokenizer=tiny_model_dir)
    out = backend.generate([GenerationRequest(conversation(i), n=4) for i in range(3)],
                           SamplingConfig(temperature=1.0, max_new_tokens=16))
    assert [len(o) for o in out] == [4, 4, 4]
    assert backend.stats.as_dict() == {"calls": 1, "requests": 3, "samples": 12, "retries": 0}
    greedy = backend.generate([GenerationRequest(conversation(i), n=2) for i in range(3)], GREEDY)
    local = hf.generate([GenerationRequest(conversation(i), n=2) for i in range(3)], GREEDY)
    assert greedy == local
    assert backend.count_tokens(conversation(1)) == hf.count_tokens(conversation(1))


def test_openai_wire_format_has_choices_and_usage(openai_server, hf):
    r = requests.post(f"{openai_server}/chat/completions", timeout=60, json={
        "model": "tiny", "messages": llm.chat_messages(conversation(0)), "n": 3, "temperature": 1.0,
        "max_tokens": 8, "seed": 1})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == hf.count_tokens(conversation(0))
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_openai_tops_up_when_server_caps_choices(policy_file):
    with start_openai_server(None, "--policy-json", policy_file, "--max-choices", "1") as url:
        backend = OpenAIBackend("scripted", url, "EMPTY")
        out = backend.generate([GenerationRequest(conversation(1), n=3, seed=7), GenerationRequest(conversation(0), n=2)],
                               SAMPLED)
        served = requests.get(url.removesuffix("/v1") + "/health", timeout=5).json()
    assert out == [["Thought: one\nAction: get 1 oak log"] * 3, ["Action: inventory"] * 2]
    assert served["requests"] == 5  # one call per missing sample


def test_openai_down_endpoint_fails_after_bounded_retries(caplog):
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = OpenAIBackend("m", url, SECRET, max_retries=3, timeout=2, backoff=0.01)
    with caplog.at_level(logging.DEBUG), pytest.raises(BackendError) as err:
        backend.generate([GenerationRequest(conversation(0))], GREEDY)
    msg = str(err.value)
    assert url in msg and "4 attempts" in msg and "3 retries" in msg
    assert backend.stats.retries == 3
    assert sum("retry" in r.getMessage() for r in caplog.records if r.name == "agent_r.llm") == 3
    assert SECRET not in msg and SECRET not in caplog.text


def test_openai_completes_through_faults_and_counts_retries(policy_file):
    with start_openai_server(None, "--policy-json", policy_file, "--fail-rate", "0.2", "--fail-seed", "3",
                             "--fail-kinds", "429,500,timeout") as url:
        backend = OpenAIBackend("scripted", url, SECRET, max_concurrency=4, max_retries=8, timeout=1.5, backoff=0.01)
        out = backend.generate([GenerationRequest(conversation(i % 3), n=2) for i in range(20)], SAMPLED)
        served = requests.get(url.removesuffix("/v1") + "/health", timeout=5).json()
    assert [len(o) for o in out] == [2] * 20
    assert out[1] == ["Thought: one\nAction: get 1 oak log"] * 2
    assert served["faults"] > 0
    assert backend.stats.retries == served["faults"]  # every injected fault was retried, and counted
    assert served["requests"] == 20 + served["faults"]


def test_api_key_never_leaks(policy_file, caplog):
    with caplog.at_level(logging.DEBUG), start_openai_server(None, "--policy-json", policy_file,
                                                             "--api-key", "the-right-key") as url:
        backend = OpenAIBackend("scripted", url, SECRET, max_retries=1, backoff=0.01)
        with pytest.raises(BackendError) as err:
            backend.generate([GenerationRequest(conversation(0))], GREEDY)
        ok = OpenAIBackend("scripted", url, "the-right-key").generate([GenerationRequest(conversation(0))], GREEDY)
    assert ok == [["Action: inventory"]]
    assert "401" in str(err.value) and "OPENAI_API_KEY" in str(err.value)
    assert backend.stats.retries == 0  # an auth error is not transient
    assert SECRET not in str(err.value) and SECRET not in repr(err.value)
    assert SECRET not in json.dumps(backend.describe()) and SECRET not in caplog.text


def test_openai_count_tokens_approximation_without_tokenizer():
    backend = OpenAIBackend("m", "http://127.0.0.1:9/v1", None)
    msgs = [{"role": "user", "content": "x" * 10}, {"role": "assistant", "content": "y" * 7}]
    assert backend.count_tokens(msgs) == 5 + 2 * 4  # ceil(17 / 4) + 4 per message


# ----------------------------------------------------------------------------- selection

def backend_settings(**environ) -> BackendSettings:
    return parse(BackendSettings, argv=[], environ=environ)


def test_make_backend_reads_openai_env(openai_server, tiny_model_dir, hf):
    settings = backend_settings(BACKEND="openai", OPENAI_BASE_URL=openai_server, OPENAI_API_KEY=SECRET,
                                MODEL_NAME="tiny-served", MODEL_DIR=tiny_model_dir, OPENAI_CONCURRENCY="2")
    backend = make_backend(settings, seed=3)
    assert isinstance(backend, OpenAIBackend)
    assert backend.describe()["model"] == "tiny-served" and backend.max_concurrency == 2
    assert SECRET not in json.dumps(manifest_config(settings))
    assert backend.count_tokens(conversation(0)) == hf.count_tokens(conversation(0))  # tokenizer from MODEL_DIR
    assert backend.generate([GenerationRequest(conversation(0))], GREEDY) == hf.generate(
        [GenerationRequest(conversation(0))], GREEDY)


def test_make_backend_hf_default_and_user_factory(monkeypatch, tiny_model_dir, policy_file):
    monkeypatch.setattr(llm, "_vllm_usable", lambda: False)
    hf = make_backend(BackendSettings(model_dir=tiny_model_dir, hf_batch_size=2), seed=1)
    assert isinstance(hf, HFBackend) and hf.batch_size == 2
    user = make_backend(BackendSettings(backend="python:tests.support.doubles:table_backend", model_dir=policy_file),
                        seed=1)
    assert isinstance(user, ScriptedBackend)
    assert user.generate([GenerationRequest(conversation(5), n=2)], GREEDY) == [["Action: inventory", "Action: wait"]]


def test_make_backend_unknown_kind_lists_choices(tiny_model_dir):
    with pytest.raises(UsageError) as err:
        make_backend(BackendSettings(backend="vlm", model_dir=tiny_model_dir))
    msg = str(err.value)
    assert "'vlm'" in msg and all(k in msg for k in ("vllm", "openai", "hf", "python:MODULE:FACTORY"))
    for bad in ("python:nope", "python:tests.support.no_such_module:f", "python:tests.support.doubles:missing"):
        with pytest.raises(UsageError):
            make_backend(BackendSettings(backend=bad, model_dir=tiny_model_dir))


def test_vllm_missing_gives_install_hint(monkeypatch, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail as when not installed
    with pytest.raises(BackendError) as err:
        make_backend(BackendSettings(backend="vllm", model_dir=tiny_model_dir))
    assert "pip install vllm" in str(err.value) and "--backend hf" in str(err.value)
    assert err.value.user_facing


def test_resolve_model_dir(monkeypatch, tmp_path, tiny_model_dir):
    assert resolve_model_dir(tiny_model_dir) == tiny_model_dir
    assert resolve_model_dir("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    missing = str(tmp_path / "no" / "model")
    with pytest.raises(UsageError) as err:
        resolve_model_dir(missing)
    assert "MODEL_DIR" in str(err.value) and missing in str(err.value) and "config.json" in str(err.value)
    monkeypatch.setattr(llm, "BUNDLED_MODEL", tmp_path / "models" / "textcraft-tiny")
    with pytest.raises(UsageError) as err:
        resolve_model_dir(None)
    assert "MODEL_DIR is not set" in str(err.value)
    monkeypatch.setattr(llm, "BUNDLED_MODEL", llm.Path(tiny_model_dir))
    assert resolve_model_dir("") == tiny_model_dir


# ----------------------------------------------------------------------------- doubles

def test_scripted_double_records_batches_and_applies_stop():
    seen = []

    def policy(messages, index, seed):
        seen.append(("loss" in messages[2], index, seed))
        return f"Thought: s{index}\nAction: act {seed}"

    backend = ScriptedBackend(policy)
    out = backend.generate([GenerationRequest(conversation(0), n=2, seed=9), GenerationRequest(conversation(1))],
                           SamplingConfig(stop=("\nAction",)))
    assert out == [["Thought: s0", "Thought: s1"], ["Thought: s0"]]
    assert seen == [(False, 0, 9), (False, 1, 9), (False, 0, None)]
    assert backend.batch_sizes == [2] and backend.stats.samples == 3
    assert backend.count_tokens([{"role": "user", "content": "a  b\nc"}]) == 3


def test_latency_double_charges_per_call_and_longest_completion(monkeypatch):
    slept = []
    monkeypatch.setattr("tests.support.doubles.time.sleep", slept.append)
    backend = LatencyModelBackend(lambda m, i, s: "w " * (3 + i), per_call=0.5, per_token=0.1)
    backend.generate([GenerationRequest(conversation(0), n=3)], SamplingConfig())
    assert slept == [pytest.approx(0.5 + 0.1 * 5)]


def test_table_backend_errors_are_clear(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text('{"x": "not a list"}')
    with pytest.raises(UsageError, match="non-empty lists"):
        table_backend(str(bad))
    nodefault = tmp_path / "n.json"
    nodefault.write_text('{"only this": ["Action: a"]}')
    with pytest.raises(BackendError, match="no default"):
        table_backend(str(nodefault)).generate([GenerationRequest(conversation(0))], SamplingConfig())


def test_model_name_precedence():
    from agent_r.llm import BUNDLED_MODEL
    from agent_r.search import SearchSettings

    name = lambda argv=(), **env: parse(SearchSettings, list(argv), env).model_name()  # noqa: E731
    assert name() == BUNDLED_MODEL.name
    assert name(MODEL_DIR="/models/Llama-3.1-8B-Instruct/") == "Llama-3.1-8B-Instruct"
    assert name(MODEL_DIR="served-name") == "served-name"  # never resolved: openai names work
    assert name(MODEL_DIR="/models/x", MODEL_NAME="iter1") == "iter1"
    assert name(["--model_name", "flag"], MODEL_DIR="/models/x", MODEL_NAME="iter1") == "flag"
