"""The batch driver (agent_r/driver.py) against backends: one checked model
call per round, slots refilled before it, every job accounted for, and a
request the backend cannot serve failing only its own job."""
from __future__ import annotations

import pytest

from agent_r.driver import DriverConfig, generate_checked, run_jobs
from agent_r.llm import BackendError, GenerationRequest, PromptTooLong, VLLMBackend
from tests.backends.common import SAMPLED_16, crafting_chat


class _Echo:
    """A driver job asking one question; returns its answer."""

    def __init__(self, key: str, messages: list[dict]):
        self.key, self.messages = key, messages

    def run(self, client):
        samples = yield GenerationRequest(self.messages, n=1, seed=1)
        return samples[0]


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
