"""Runtime rules every backend follows: how request seeds are made, greedy
gives one sample, a prompt that cannot fit fails alone, and an endpoint that
ignores the sampling settings is named once."""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Sequence

from agent_r.llm.base import NOTE_LOCK, Backend, GenerationRequest, PromptTooLong, RequestFailed, SamplingConfig

log = logging.getLogger(__name__)


def derive_seed(*parts: Any) -> int:
    """A 31-bit request seed from printable parts (run seed, task, position...):
    stable across runs and machines (unlike hash()), and independent of what
    else shares the batch, so per-request-seeded backends give the same output
    at any concurrency."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def combined_seed(seeds: Sequence[int]) -> int:
    """One 63-bit seed for a whole batch of seeded requests (a backend that
    can seed only the batch, not each request)."""
    digest = hashlib.sha256(",".join(map(str, seeds)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def single_if_greedy(backend: Backend, requests: Sequence[GenerationRequest],
                     sampling: SamplingConfig) -> list[GenerationRequest]:
    """``requests`` with n = 1 when greedy, said once per backend: greedy
    decoding has one answer (vLLM rejects greedy n > 1; n identical copies
    would only be dropped as duplicates)."""
    requests = list(requests)
    if sampling.temperature != 0 or all(r.n == 1 for r in requests):
        return requests
    with NOTE_LOCK:
        if not backend.__dict__.get("_greedy_noted"):
            backend.__dict__["_greedy_noted"] = True
            log.info("TEMP=0 is greedy decoding: one sample per request (n=%d asked), so a search expansion adds "
                     "one child; set TEMP > 0 for N_GEN different samples", max(r.n for r in requests))
    return [GenerationRequest(r.messages, 1, r.seed) for r in requests]


def too_long(backend: Backend, prompt_tokens: int, max_new_tokens: int) -> PromptTooLong:
    """The failure put in the place of a request whose prompt leaves no room
    for a reply: that request fails alone, the batch goes on."""
    return PromptTooLong(
        f"the prompt has {prompt_tokens} tokens, which leaves no room for a reply (max_new_tokens="
        f"{max_new_tokens}) in the model's context of {backend.context_limit} tokens ({backend.name}); "
        "truncation never cuts the task's first messages and the last turn, so this item cannot fit")


class DuplicateWatch:
    """Warns once when, at temperature > 0, nearly every extra sample of a
    request is an exact copy of a sibling: the sign of an endpoint that
    ignores sampling settings (one choice, the same reply for every seed),
    which makes every search expansion a single child."""

    def __init__(self, min_extra: int = 20, threshold: float = 0.95) -> None:
        self.min_extra, self.threshold = min_extra, threshold
        self.extra = self.copies = 0
        self.warned = False

    def observe(self, backend: Backend, outputs: Sequence[Any], sampling: SamplingConfig) -> None:
        if sampling.temperature == 0 or self.warned:
            return
        for out in outputs:
            if not isinstance(out, RequestFailed) and len(out) > 1:
                self.extra += len(out) - 1
                self.copies += len(out) - len(set(out))
        if self.extra >= self.min_extra and self.copies >= self.threshold * self.extra:
            self.warned = True
            log.warning(
                "%d of %d extra samples at TEMP=%g were exact copies of a sibling sample: backend %s seems to "
                "ignore the sampling settings (temperature, seed, n) - e.g. `transformers serve` answers one "
                "choice and the same reply for every seed - so every expansion collapses to one child. Serve "
                "the model with `vllm serve`, or use --backend vllm / hf.", self.copies, self.extra,
                sampling.temperature, backend.name)


def duplicate_watch(backend: Backend) -> DuplicateWatch:
    """The backend's DuplicateWatch (one per backend, for its whole run)."""
    with NOTE_LOCK:
        return backend.__dict__.setdefault("_duplicate_watch", DuplicateWatch())
