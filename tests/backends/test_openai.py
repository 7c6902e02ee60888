"""The openai backend: the real openai client against a real local
OpenAI-compatible server (a process serving the tiny model or a scripted
policy table), and against a fake `vllm serve` that refuses what vLLM refuses."""
from __future__ import annotations

import json
import logging

import pytest
import requests

from agent_r.driver import generate_checked
from agent_r.llm import BackendError, GenerationRequest, OpenAIBackend, PromptTooLong, SamplingConfig, chat_messages
from tests.backends.common import (GREEDY, GREEDY_16, SAMPLED, SAMPLED_16, SECRET, crafting_chat, fake_serve,
                                   numbered_chat)
from tests.support.env_fixtures import stop_server
from tests.support.model_fixtures import free_port, start_openai_server


def test_openai_returns_n_samples_and_matches_local_greedy(openai_server, tiny_model_dir, hf):
    """n samples per request; greedy replies and token counts equal the
    same model's under hf (the tokenizer comes from the model directory)."""
    backend = OpenAIBackend("tiny", openai_server, SECRET, max_concurrency=4, tokenizer=tiny_model_dir)
    out = backend.generate([GenerationRequest(numbered_chat(i), n=4) for i in range(3)],
                           SamplingConfig(temperature=1.0, max_new_tokens=16))
    assert [len(o) for o in out] == [4, 4, 4]
    assert backend.stats.as_dict() == {"calls": 1, "requests": 3, "samples": 12, "retries": 0}
    greedy = backend.generate([GenerationRequest(numbered_chat(i), n=2) for i in range(3)], GREEDY)
    local = hf.generate([GenerationRequest(numbered_chat(i), n=2) for i in range(3)], GREEDY)
    assert greedy == local
    assert backend.count_tokens(numbered_chat(1)) == hf.count_tokens(numbered_chat(1))


def test_openai_wire_format_has_choices_and_usage(openai_server, hf):
    """The local test server answers in the chat-completions format the
    openai client parses: indexed choices, assistant role, token usage."""
    r = requests.post(f"{openai_server}/chat/completions", timeout=60, json={
        "model": "tiny", "messages": chat_messages(numbered_chat(0)), "n": 3, "temperature": 1.0,
        "max_tokens": 8, "seed": 1})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == hf.count_tokens(numbered_chat(0))
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_openai_tops_up_when_server_caps_choices(policy_file):
    """A server that returns fewer choices than n is asked again for the
    missing samples, one call per missing sample when it returns one."""
    with start_openai_server(None, "--policy-json", policy_file, "--max-choices", "1") as url:
        backend = OpenAIBackend("scripted", url, "EMPTY")
        out = backend.generate([GenerationRequest(numbered_chat(1), n=3, seed=7),
                                GenerationRequest(numbered_chat(0), n=2)], SAMPLED)
        served = requests.get(url.removesuffix("/v1") + "/health", timeout=5).json()
    assert out == [["Thought: one\nAction: get 1 oak log"] * 3, ["Action: inventory"] * 2]
    assert served["requests"] == 5  # one call per missing sample


def test_openai_down_endpoint_fails_after_bounded_retries(caplog):
    """An unreachable endpoint is retried max_retries times, each retry
    logged and counted, then one error naming the endpoint and the bound;
    the API key is in neither."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    backend = OpenAIBackend("m", url, SECRET, max_retries=3, timeout=2, backoff=0.01)
    with caplog.at_level(logging.DEBUG), pytest.raises(BackendError) as err:
        backend.generate([GenerationRequest(numbered_chat(0))], GREEDY)
    msg = str(err.value)
    assert url in msg and "4 attempts" in msg and "3 retries" in msg
    assert backend.stats.retries == 3
    assert sum("retry" in r.getMessage() for r in caplog.records if r.name == "agent_r.llm.openai_backend") == 3
    assert SECRET not in msg and SECRET not in caplog.text


def test_openai_completes_through_faults_and_counts_retries(policy_file):
    """With 20% injected faults (429, 500, timeouts) every request is
    answered, and every fault was retried exactly once and counted."""
    with start_openai_server(None, "--policy-json", policy_file, "--fail-rate", "0.2", "--fail-seed", "3",
                             "--fail-kinds", "429,500,timeout") as url:
        backend = OpenAIBackend("scripted", url, SECRET, max_concurrency=4, max_retries=8, timeout=1.5, backoff=0.01)
        out = backend.generate([GenerationRequest(numbered_chat(i % 3), n=2) for i in range(20)], SAMPLED)
        served = requests.get(url.removesuffix("/v1") + "/health", timeout=5).json()
    assert [len(o) for o in out] == [2] * 20
    assert out[1] == ["Thought: one\nAction: get 1 oak log"] * 2
    assert served["faults"] > 0
    assert backend.stats.retries == served["faults"]  # every injected fault was retried, and counted
    assert served["requests"] == 20 + served["faults"]


def test_api_key_never_leaks(policy_file, caplog):
    """A rejected key (401) is not retried, the error says to check
    OPENAI_API_KEY, and the key itself appears in no error, log or manifest."""
    with caplog.at_level(logging.DEBUG), start_openai_server(None, "--policy-json", policy_file,
                                                             "--api-key", "the-right-key") as url:
        backend = OpenAIBackend("scripted", url, SECRET, max_retries=1, backoff=0.01)
        with pytest.raises(BackendError) as err:
            backend.generate([GenerationRequest(numbered_chat(0))], GREEDY)
        ok = OpenAIBackend("scripted", url, "the-right-key").generate([GenerationRequest(numbered_chat(0))], GREEDY)
    assert ok == [["Action: inventory"]]
    assert "401" in str(err.value) and "OPENAI_API_KEY" in str(err.value)
    assert backend.stats.retries == 0  # an auth error is not transient
    assert SECRET not in str(err.value) and SECRET not in repr(err.value)
    assert SECRET not in json.dumps(backend.describe()) and SECRET not in caplog.text


def test_openai_count_tokens_approximation_without_tokenizer():
    """Without a tokenizer, tokens are approximated: ceil(chars / 4) + 4 per message."""
    backend = OpenAIBackend("m", "http://127.0.0.1:9/v1", None)
    msgs = [{"role": "user", "content": "x" * 10}, {"role": "assistant", "content": "y" * 7}]
    assert backend.count_tokens(msgs) == 5 + 2 * 4  # ceil(17 / 4) + 4 per message


def test_greedy_n_above_one_over_vllm_serve_and_400_hint():
    """Greedy requests go out with n=1 (vllm serve refuses greedy n > 1); any
    other 400 is one user-facing error with the server's reason and no
    API-key hint."""
    proc, url = fake_serve()
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        assert [len(o) for o in backend.generate([GenerationRequest(crafting_chat(), n=3)] * 2, GREEDY_16)] == [1, 1]
        raw = requests.post(f"{url}/chat/completions", timeout=10, json={
            "model": "m", "messages": crafting_chat(), "n": 3, "temperature": 0})
        assert raw.status_code == 400   # what the server does with the request we no longer send
        with pytest.raises(BackendError) as err:   # any other 400: the server's reason, no API-key hint
            backend.generate([GenerationRequest(crafting_chat())], SamplingConfig(max_new_tokens=0))
    finally:
        stop_server(proc)
    msg = str(err.value)
    assert "HTTP 400" in msg and "max_tokens must be at least 1, got 0" in msg
    assert "OPENAI_API_KEY" not in msg and "max_new_tokens" in msg and err.value.user_facing


def test_context_refusal_over_http_fails_one_request_and_teaches_the_limit():
    """A context-length refusal fails only that request (not user-facing),
    and the limit the server names becomes the backend's context_limit."""
    proc, url = fake_serve("--max-model-len", "300")
    try:
        backend = OpenAIBackend("m", url, "EMPTY", max_retries=0)
        long_one = GenerationRequest(crafting_chat(filler=400))
        out = backend.generate([GenerationRequest(crafting_chat("a")), long_one, GenerationRequest(crafting_chat("c"))],
                               SAMPLED_16)
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
        long_history = GenerationRequest(crafting_chat(turns=30), seed=3)
        assert backend.count_tokens(long_history.messages) > 600
        out = generate_checked(backend, [long_history, GenerationRequest(crafting_chat("b"))],
                               SamplingConfig(temperature=1.0, max_new_tokens=50), max_token_length=4096,
                               allow_failures=True)
        served = requests.get(url.removesuffix("/v1") + "/health", timeout=5).json()
    finally:
        stop_server(proc)
    assert all(isinstance(o, list) and o for o in out)
    assert served["requests"] == 3   # two, then the long one again, shorter
    assert backend.prompt_budget(4096, 50) == 550
