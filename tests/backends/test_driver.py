"""The batch driver (agent_r/driver.py) against backends: one checked model
call per round, slots refilled before it, every job accounted for, and a
request the backend cannot serve failing only its own job."""
from __future__ import annotations

import pytest

from agent_r.driver import DriverConfig, generate_checked, run_jobs
from agent_r.llm import BackendError, GenerationRequest, PromptTooLong, SamplingConfig, VLLMBackend
from tests.backends.common import SAMPLED_16, crafting_chat
from tests.support.doubles import ScriptedBackend

ECHO = lambda messages, i, seed: f"answer to {messages[-1]['content']}"  # noqa: E731


class _Echo:
    """A driver job asking one question; returns its answer."""

    def __init__(self, key: str, messages: list[dict]):
        self.key, self.messages = key, messages

    def run(self, client):
        samples = yield GenerationRequest(self.messages, n=1, seed=1)
        return samples[0]


class _Turns:
    """A driver job asking ``turns`` one-line questions "KEY step I"; returns its answers."""

    def __init__(self, key: str, turns: int):
        self.key, self.turns = key, turns

    def run(self, client):
        answers = []
        for i in range(self.turns):
            samples = yield GenerationRequest([{"role": "user", "content": f"{self.key} step {i}"}], n=1)
            answers.append(samples[0])
        return answers


class _DropsLastAnswer(ScriptedBackend):
    """Test double of a faulty backend: answers every request of a batch but the last."""

    def generate(self, requests, sampling):
        return super().generate(requests, sampling)[:-1]


class _EmptyOnResend(ScriptedBackend):
    """Test double of a server with a 300-token context it does not announce:
    its first call refuses longer prompts and so teaches the limit; a later
    call answers nothing at all."""

    def generate(self, requests, sampling):
        if self.context_limit is None:
            self.context_limit = 300
            return [PromptTooLong("over 300 tokens") if self.count_tokens(r.messages) > 300 else out
                    for r, out in zip(requests, super().generate(requests, sampling))]
        return []


def config(concurrency: int) -> DriverConfig:
    return DriverConfig(SamplingConfig(temperature=1.0, max_new_tokens=16), max_token_length=4096,
                        concurrency=concurrency)


def test_a_backend_answering_fewer_outputs_than_requests_stops_the_run():
    """A job must never vanish silently: when the backend returns fewer
    answers than it was asked, the run stops with an error naming the
    backend and the count, instead of leaving a job unanswered and unreported."""
    done = []
    with pytest.raises(BackendError, match="backend scripted answered 2 of 3 requests"):
        run_jobs([_Turns(k, 1) for k in "abc"], _DropsLastAnswer(ECHO), lambda: object(), config(3), done.append)
    assert done == []


def test_a_resent_prompt_without_an_answer_is_a_clear_error():
    """The prompt resent after a context refusal is checked like the first
    call: no answer for it is the backend's error, not a 'too long' failure
    of the item."""
    backend = _EmptyOnResend(ECHO)
    long_history = GenerationRequest(crafting_chat(turns=10))
    assert backend.count_tokens(long_history.messages) > 300
    with pytest.raises(BackendError, match="backend scripted answered 0 of 1 requests"):
        generate_checked(backend, [long_history, GenerationRequest(crafting_chat("b"))], SAMPLED_16,
                         max_token_length=4096, allow_failures=True)


def test_a_freed_slot_is_refilled_before_the_next_model_call():
    """With concurrency 2 and four jobs, a job that ends frees its slot and
    the next queued job's first request is already in the very next model
    call: every call is full while jobs wait, and the run takes as few calls
    as the longest chain of turns allows."""
    backend = ScriptedBackend(ECHO)
    done = {}
    jobs = [_Turns("a", 1), _Turns("b", 3), _Turns("c", 1), _Turns("d", 2)]
    stats = run_jobs(jobs, backend, lambda: object(), config(2), lambda o: done.__setitem__(o.job.key, o))
    asked = [[r.messages[-1]["content"] for r in batch.requests] for batch in backend.batches]
    assert asked == [["a step 0", "b step 0"],
                     ["b step 1", "c step 0"],     # a ended after call 1: c started in its slot before call 2
                     ["b step 2", "d step 0"],     # c ended after call 2: d joined call 3
                     ["d step 1"]]
    assert stats.model_calls == 4 and stats.batch_sizes == [2, 2, 2, 1]
    assert {k: o.result for k, o in done.items()} == {
        "a": ["answer to a step 0"], "b": [f"answer to b step {i}" for i in range(3)], "c": ["answer to c step 0"],
        "d": ["answer to d step 0", "answer to d step 1"]}
    assert all(o.error is None for o in done.values())


def test_without_allow_failures_a_failed_request_is_one_clear_error(vllm_fake, short_model_dir):
    """A checked call that must not fail items turns a request the backend
    could not serve into one error with the count and the reason."""
    backend = VLLMBackend(short_model_dir)
    with pytest.raises(BackendError) as err:
        generate_checked(backend, [GenerationRequest(crafting_chat()), GenerationRequest(crafting_chat(filler=300))],
                         SAMPLED_16)
    assert "1 of 2 requests failed" in str(err.value) and "context of 256" in str(err.value)


def test_driver_fails_only_the_job_whose_prompt_cannot_fit(vllm_fake, short_model_dir):
    """A prompt that cannot fit the context fails its own job with
    PromptTooLong; the other jobs of the same model call finish."""
    backend = VLLMBackend(short_model_dir)
    jobs = [_Echo("ok1", crafting_chat("a")), _Echo("long", crafting_chat(filler=300)),
            _Echo("ok2", crafting_chat("c"))]
    done = {}
    stats = run_jobs(jobs, backend, lambda: object(), DriverConfig(SAMPLED_16, max_token_length=4096, concurrency=3),
                     lambda outcome: done.__setitem__(outcome.job.key, outcome))
    assert stats.model_calls == 1
    assert isinstance(done["long"].error, PromptTooLong)
    assert done["ok1"].error is None and done["ok2"].error is None and done["ok1"].result.startswith("Thought")
