"""Test doubles for model backends (not real models; named as such).

A real model cannot give hand-computable trees or timings, so search / eval /
revision tests use these:

* ``ScriptedBackend``: a deterministic double driven by a Python policy.
* ``table_backend``: a factory for ``--backend python:tests.support.doubles:table_backend``
  in scripts run as subprocesses; the policy is a JSON table (format below).
* ``LatencyModelBackend``: a scripted double that sleeps like a GPU server, for
  bench scripts (a batched call costs about as much as a single one).

Table file format (``MODEL_DIR`` / model_dir points at it)::

    {
      "Goal: craft stick": ["Thought: t\\nAction: get 2 oak planks", "Action: inventory"],
      "Judgment":          ["The step helps.\\nJudgment: Good"],
      "default":           ["Action: inventory"]
    }

Keys are tried in file order; the first key that is a substring of the LAST
user message selects its completion list (key "default" matches when no other
key does). Sample ``i`` of a request gets ``completions[i % len(completions)]``,
so n samples cycle through the list. No match and no default -> BackendError.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agent_r.settings import UsageError
from agent_r.llm import Backend, BackendError, GenerationRequest, SamplingConfig, chat_messages, cut_at_stop

Policy = Callable[[list[dict], int, "int | None"], str]


@dataclass
class RecordedBatch:
    requests: list[GenerationRequest]
    sampling: SamplingConfig


class ScriptedBackend(Backend):
    """Test double: completions come from ``policy(messages, sample_index, seed)``.

    Messages reach the policy through ``chat_messages`` (no ``loss`` keys), like
    a real model. Stop strings are applied to the policy's text. Every batch is
    recorded in ``self.batches`` so tests can assert batch sizes and call counts.
    ``count_tokens`` = total whitespace-separated words of all message contents.
    """

    name = "scripted"

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.policy = policy
        self.batches: list[RecordedBatch] = []
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        requests = list(requests)
        out = [
            [cut_at_stop(self.policy(chat_messages(r.messages), i, r.seed), sampling.stop) for i in range(r.n)]
            for r in requests
        ]
        with self._lock:
            self.batches.append(RecordedBatch(requests, sampling))
            self.stats.calls += 1
            self.stats.requests += len(requests)
            self.stats.samples += sum(len(o) for o in out)
        return out

    def count_tokens(self, messages: list[dict]) -> int:
        return sum(len(m["content"].split()) for m in messages)

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b.requests) for b in self.batches]


class LatencyModelBackend(ScriptedBackend):
    """Scripted double that sleeps like a GPU server answering a batch.

    Cost of one generate() = ``per_call`` seconds + ``per_token`` seconds x the
    longest completion in the batch (tokens approximated by words). On a GPU all
    sequences of a batch decode in lockstep, so 16 requests cost about what the
    longest one costs; this makes batching wins visible in benchmarks without a
    GPU. Defaults (0.05 s per call, 0.01 s per token step) are roughly an 8B
    model's prefill overhead and decode step on one H100.
    """

    name = "latency-scripted"

    def __init__(self, policy: Policy, per_call: float = 0.05, per_token: float = 0.01) -> None:
        super().__init__(policy)
        self.per_call = per_call
        self.per_token = per_token

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        out = super().generate(requests, sampling)
        longest = max((len(c.split()) for o in out for c in o), default=0)
        time.sleep(self.per_call + self.per_token * min(longest, sampling.max_new_tokens))
        return out

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "per_call": self.per_call, "per_token": self.per_token}


def load_table(path: str | os.PathLike) -> dict[str, list[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"policy table {path} does not exist: point MODEL_DIR at a JSON table file") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"policy table {path} is not valid JSON ({exc})") from None
    if not isinstance(table, dict) or not all(
        isinstance(v, list) and v and all(isinstance(c, str) for c in v) for v in table.values()
    ):
        raise UsageError(f"policy table {path} must map strings to non-empty lists of strings")
    return table


def table_policy(table: dict[str, list[str]]) -> Policy:
    """The policy described in this module's docstring."""

    def policy(messages: list[dict], index: int, seed: int | None) -> str:
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        for key, completions in table.items():
            if key != "default" and key in last_user:
                return completions[index % len(completions)]
        if "default" in table:
            return table["default"][index % len(table["default"])]
        raise BackendError(f"policy table has no key matching the last user message {last_user[:80]!r} and no default")

    return policy


def table_backend(model_dir: str, **options: Any) -> ScriptedBackend:
    """``--backend python:tests.support.doubles:table_backend``; model_dir is the
    JSON table. Other options (seed, max_model_len, ...) are ignored."""
    return ScriptedBackend(table_policy(load_table(model_dir)))


def latency_table_backend(model_dir: str, **options: Any) -> LatencyModelBackend:
    """Like ``table_backend`` but sleeping like a GPU server; constants from env
    LATENCY_PER_CALL / LATENCY_PER_TOKEN (seconds; defaults 0.05 / 0.01)."""
    return LatencyModelBackend(
        table_policy(load_table(model_dir)),
        per_call=float(os.environ.get("LATENCY_PER_CALL", "0.05")),
        per_token=float(os.environ.get("LATENCY_PER_TOKEN", "0.01")),
    )
