"""The backend interface: what a batch asks for, what comes back, the errors,
and the one abstract class every backend (built-in, user factory, test
double) implements."""
from __future__ import annotations

import abc
import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from agent_r.conversation import TRUNCATION_MARGIN
from agent_r.knobs import DEFAULT_MAX_NEW_TOKENS
from agent_r.settings import UsageError

log = logging.getLogger(__name__)

# Guards the once-per-backend notes (greedy n forced to 1, the lowered prompt
# budget, the duplicate watch): a backend is shared by the driver's threads.
NOTE_LOCK = threading.Lock()


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()
    top_p: float = 1.0


@dataclass
class GenerationRequest:
    """One conversation to continue, ``n`` times. ``seed`` makes this request's
    samples reproducible on backends with per-request seeds (vllm, scripted
    doubles); independently of what else is in the batch only where the
    backend's kernels are batch-invariant (docs/backends.md, Reproducibility)."""

    messages: list[dict]
    n: int = 1
    seed: int | None = None


@dataclass
class BackendStats:
    calls: int = 0          # generate() invocations
    requests: int = 0       # conversations sent
    samples: int = 0        # completions returned
    retries: int = 0        # transient failures retried (openai)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class BackendError(Exception):
    """A model backend could not produce output (after bounded retries)."""

    user_facing = True


class RequestFailed(BackendError):
    """One request of a batch could not be served; the rest of the batch was.
    A backend puts it in that request's place in generate()'s result. It
    fails that item (a tree, an episode), never the run: not user_facing."""

    user_facing = False


class PromptTooLong(RequestFailed):
    """The request's prompt does not fit the model's context."""


class Backend(abc.ABC):
    """Generate for a batch; count a conversation's chat-prompt tokens.

    ``context_limit`` is the most tokens (prompt + reply) one request may
    take, when the backend knows it (vllm: the engine's max_model_len; hf: the
    model's positions; openai: learned from the server's rejections)."""

    name: str = "backend"
    context_limit: int | None = None

    def __init__(self) -> None:
        self.stats = BackendStats()

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        """Return, for each request, its completions (assistant text only):
        ``n`` of them, one when greedy (``single_if_greedy``), or a
        RequestFailed in its place when that request alone could not be served."""

    @abc.abstractmethod
    def count_tokens(self, messages: list[dict]) -> int:
        """Tokens of the real chat prompt for ``messages`` (with the generation prompt)."""

    def close(self) -> None:
        """Release model memory / connections."""

    def describe(self) -> dict[str, Any]:
        """What goes into run manifests (never secrets)."""
        return {"backend": self.name}

    def startup_line(self) -> str:
        """The one line logged when the backend is ready: what runs where."""
        return " | ".join(f"{k} {v}" for k, v in self.describe().items() if v is not None)

    def prompt_budget(self, max_token_length: int, max_new_tokens: int) -> int:
        """The MAX_TOKEN_LENGTH prompts are truncated to on this backend: the
        setting, lowered so that a truncated prompt plus ``max_new_tokens``
        fits ``context_limit``. Logs once when it lowers the setting; a
        UsageError when the reply alone leaves no room for a prompt."""
        limit = self.context_limit
        if limit is None or max_token_length + max_new_tokens <= limit:
            return max_token_length
        budget = limit - max_new_tokens
        if budget <= TRUNCATION_MARGIN:
            raise UsageError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {limit} "
                f"tokens ({self.name}): lower --max_new_tokens, or raise --max_model_len up to the model's limit.")
        with NOTE_LOCK:
            noted = self.__dict__.setdefault("_budget_noted", set())
            if (max_token_length, max_new_tokens) not in noted:
                noted.add((max_token_length, max_new_tokens))
                log.warning("prompts are truncated to %d tokens, not MAX_TOKEN_LENGTH=%d: the model's context is "
                            "%d tokens and %d are kept for the reply (max_new_tokens)", budget, max_token_length,
                            limit, max_new_tokens)
        return budget
