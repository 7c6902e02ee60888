"""The backend test doubles (tests/support/doubles.py) behave as their
docstrings say: other tests' expectations are computed from these rules."""
from __future__ import annotations

import pytest

from agent_r.llm import BackendError, GenerationRequest, SamplingConfig
from agent_r.settings import UsageError
from tests.backends.common import numbered_chat
from tests.support.doubles import LatencyModelBackend, ScriptedBackend, table_backend


def test_scripted_double_records_batches_and_applies_stop():
    """The policy sees messages without ``loss`` keys, the sample index and
    the request seed; stop strings cut its text; every batch is recorded and
    tokens are whitespace-separated words."""
    seen = []

    def policy(messages, index, seed):
        seen.append(("loss" in messages[2], index, seed))
        return f"Thought: s{index}\nAction: act {seed}"

    backend = ScriptedBackend(policy)
    out = backend.generate([GenerationRequest(numbered_chat(0), n=2, seed=9), GenerationRequest(numbered_chat(1))],
                           SamplingConfig(stop=("\nAction",)))
    assert out == [["Thought: s0", "Thought: s1"], ["Thought: s0"]]
    assert seen == [(False, 0, 9), (False, 1, 9), (False, 0, None)]
    assert backend.batch_sizes == [2] and backend.stats.samples == 3
    assert backend.count_tokens([{"role": "user", "content": "a  b\nc"}]) == 3


def test_latency_double_charges_per_call_and_longest_completion(monkeypatch):
    """One call sleeps per_call + per_token x the longest completion's words."""
    slept = []
    monkeypatch.setattr("tests.support.doubles.time.sleep", slept.append)
    backend = LatencyModelBackend(lambda m, i, s: "w " * (3 + i), per_call=0.5, per_token=0.1)
    backend.generate([GenerationRequest(numbered_chat(0), n=3)], SamplingConfig())
    assert slept == [pytest.approx(0.5 + 0.1 * 5)]


def test_table_backend_errors_are_clear(tmp_path):
    """A malformed table is a usage error; a message no key matches, with no
    default, is a backend error."""
    bad = tmp_path / "t.json"
    bad.write_text('{"x": "not a list"}')
    with pytest.raises(UsageError, match="non-empty lists"):
        table_backend(str(bad))
    nodefault = tmp_path / "n.json"
    nodefault.write_text('{"only this": ["Action: a"]}')
    with pytest.raises(BackendError, match="no default"):
        table_backend(str(nodefault)).generate([GenerationRequest(numbered_chat(0))], SamplingConfig())
