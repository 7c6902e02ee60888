"""Test doubles for search tests (not real models; named as such).

``SeededTextCraftDouble`` plays TextCraft moves that a real model might try:
``inventory``, a recipe line of the task, or ``get`` of an ingredient. Which
move sample ``i`` of a request plays is a hash of (request seed, i, the last
observation), so a sample depends only on its own request - never on what else
is in the batch - like vLLM with per-request seeds. That is what the
concurrency-independence tests need, and it finds some successes.

Subprocess scripts use ``--backend python:tests.support.search_doubles:seeded_textcraft_backend``
(MODEL_DIR is ignored). To stop a run mid-way, hold it with a gate
(tests/support/faults.py ``Gate``, ``GATED`` wrapping ``SEARCH_INNER``), not
with a sleep: env ``SEARCH_DOUBLE_SLEEP`` (seconds per call) only slows a run
down, e.g. for a bench.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any, Sequence

from agent_r.llm import GenerationRequest, SamplingConfig
from tests.support.doubles import ScriptedBackend

_RECIPE = re.compile(r"^craft (\d+) (.+?) using (.+)$")


def textcraft_moves(initial_observation: str) -> list[str]:
    """Candidate actions read off a TextCraft task text."""
    moves = ["inventory"]
    for line in initial_observation.splitlines():
        m = _RECIPE.match(line.strip())
        if not m:
            continue
        moves.append(line.strip())
        for part in m.group(3).split(","):
            count, _, item = part.strip().partition(" ")
            moves.append(f"get {count} {item}")
    return moves


def seeded_textcraft_policy(messages: list[dict], index: int, seed: int | None) -> str:
    moves = textcraft_moves(messages[3]["content"])
    key = f"{seed}/{index}/{messages[-1]['content']}".encode()
    pick = int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % len(moves)
    return f"Thought: step {len(messages) // 2 - 1}.\nAction: {moves[pick]}"


class SeededTextCraftDouble(ScriptedBackend):
    """Test double: ScriptedBackend with ``seeded_textcraft_policy`` and an
    optional sleep per generate() call."""

    name = "seeded-textcraft-double"

    def __init__(self, sleep: float = 0.0) -> None:
        super().__init__(seeded_textcraft_policy)
        self.sleep = sleep

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        out = super().generate(requests, sampling)
        if self.sleep:
            time.sleep(self.sleep)
        return out


def seeded_textcraft_backend(model_dir: Any = None, **options: Any) -> SeededTextCraftDouble:
    return SeededTextCraftDouble(sleep=float(os.environ.get("SEARCH_DOUBLE_SLEEP", "0")))
