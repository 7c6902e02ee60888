"""Model backends behind one interface used by search, revision and eval.

Every stage sends *batches*: a list of conversations, each with n samples. A
backend turns a batch into as few model invocations as it can (one vLLM
`chat` call, one batched `generate`, concurrent API requests).

Selection rule (scripts' ``--backend`` flag, else env var ``BACKEND``):
  vllm      offline vllm.LLM, built once per process
  openai    any OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY)
  hf        transformers generate, batched with left padding, CPU or GPU
  python:MODULE:FACTORY   a user-supplied backend; FACTORY(model_dir, **options)
            returns a Backend (used by tests and benchmarks for test doubles)
  default   vllm when it is installed and CUDA is available, else hf.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Sequence

DEFAULT_MAX_NEW_TOKENS = 500


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()
    top_p: float = 1.0


@dataclass
class GenerationRequest:
    """One conversation to continue, ``n`` times. ``seed`` makes this request's
    samples reproducible independently of what else is in the batch, on
    backends that support per-request seeds (vllm, scripted doubles)."""

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


class Backend(abc.ABC):
    """Generate for a batch; count a conversation's chat-prompt tokens."""

    name: str = "backend"

    def __init__(self) -> None:
        self.stats = BackendStats()

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        """Return, for each request, its ``n`` completions (assistant text only)."""

    @abc.abstractmethod
    def count_tokens(self, messages: list[dict]) -> int:
        """Tokens of the real chat prompt for ``messages`` (with the generation prompt)."""

    def close(self) -> None:
        """Release model memory / connections."""

    def describe(self) -> dict[str, Any]:
        """What goes into run manifests (never secrets)."""
        return {"backend": self.name}


def chat_messages(messages: list[dict]) -> list[dict]:
    """Strip our extra keys (e.g. ``loss``) before a message list reaches a model."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]
