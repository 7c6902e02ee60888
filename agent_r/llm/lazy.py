"""A backend made at its first use, so that a run whose work is all done (a
resumed run) never loads a model, and every run decides that the same way."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from agent_r.llm.base import Backend, BackendStats, GenerationRequest, RequestFailed, SamplingConfig


class LazyBackend(Backend):
    """Stands in for the Backend that ``make`` builds, building it at the
    first call that needs a model: ``generate``, ``count_tokens``,
    ``prompt_budget`` or ``context_limit`` (truncating a prompt comes right
    before generating it). It is built at most once per LazyBackend.

    What a run reads for its summary and manifest never builds it: ``stats``
    are zeros and ``describe()`` is ``{"backend": None}`` until the model was
    needed. ``close`` closes the real backend only if it was made; a use
    after ``close`` builds a new one. ``get()`` is the real backend (built if
    need be), for attributes only one kind of backend has (e.g. a tokenizer).
    """

    def __init__(self, make: Callable[[], Backend]) -> None:
        # Backend.__init__ is not called: ``stats`` is the real backend's.
        self._make = make
        self._backend: Backend | None = None
        self._idle_stats = BackendStats()
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def get(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._make()
            return self._backend

    # --- the calls that need the model

    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        return self.get().generate(requests, sampling)

    def count_tokens(self, messages: list[dict]) -> int:
        return self.get().count_tokens(messages)

    def prompt_budget(self, max_token_length: int, max_new_tokens: int) -> int:
        return self.get().prompt_budget(max_token_length, max_new_tokens)

    @property
    def context_limit(self) -> int | None:  # type: ignore[override]
        return self.get().context_limit

    # --- what a summary reads: never builds

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._backend.name if self._backend is not None else "not loaded"

    @property
    def stats(self) -> BackendStats:  # type: ignore[override]
        return self._backend.stats if self._backend is not None else self._idle_stats

    def describe(self) -> dict[str, Any]:
        return self._backend.describe() if self._backend is not None else {"backend": None}

    def startup_line(self) -> str:
        return self._backend.startup_line() if self._backend is not None else "backend not loaded"

    def close(self) -> None:
        with self._lock:
            backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()
