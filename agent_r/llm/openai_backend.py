"""Any OpenAI-compatible chat endpoint as a backend (``--backend openai``):
vllm serve, OpenAI, Azure OpenAI."""
from __future__ import annotations

import concurrent.futures
import logging
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from agent_r.llm.base import Backend, BackendError, GenerationRequest, PromptTooLong, RequestFailed, SamplingConfig
from agent_r.llm.chat import chat_messages, chat_token_count, cut_at_stop, load_tokenizer
from agent_r.llm.model_files import model_position_limit
from agent_r.llm.rules import single_if_greedy

log = logging.getLogger(__name__)

_CONTEXT_ERROR = re.compile(r"context length|context window|maximum model length|context_length_exceeded|"
                            r"prompt is too long|too many tokens|input length", re.IGNORECASE)
_CONTEXT_LIMIT = re.compile(r"(?:maximum context length|maximum model length|context window)\D{0,12}(\d{3,})",
                            re.IGNORECASE)


def _server_message(exc: Exception) -> str:
    """The server's own error text (OpenAI-style {"error": {"message": ...}}
    or vLLM's {"message": ...}), else the exception's text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)
    return str(exc)


class OpenAIBackend(Backend):
    """Any OpenAI-compatible chat endpoint (vllm serve, OpenAI, Azure OpenAI).

    Requests of a batch go out concurrently (at most ``max_concurrency`` in
    flight), each asking for its n samples in one call and topping up if the
    server returns fewer. Transient failures (429, 5xx, timeouts, connection
    errors) are retried here, with exponential backoff (``backoff`` x 2^k
    seconds, capped at 30), at most ``max_retries`` times per call, and counted
    in ``stats.retries``; the openai client's own retries are off so none go
    uncounted. The API key is never logged, described or put in an error.

    ``count_tokens`` uses the tokenizer at ``tokenizer`` when given; otherwise
    it approximates: ceil(characters / 4) + 4 per message.
    """

    name = "openai"

    def __init__(self, model: str, base_url: str | None, api_key: str | None, max_concurrency: int = 16,
                 max_retries: int = 5, timeout: float = 120, tokenizer: str | None = None,
                 backoff: float = 0.5, azure: tuple[str, str | None, str] | None = None) -> None:
        super().__init__()
        import openai

        self._openai = openai
        self.model, self.max_concurrency, self.max_retries = model, max(1, max_concurrency), max(0, max_retries)
        self.timeout, self.backoff = timeout, backoff
        self._secret = api_key or ""
        if azure:   # (endpoint, key, api version)
            endpoint, azure_key, version = azure
            self._secret = azure_key or self._secret
            self.client = openai.AzureOpenAI(azure_endpoint=endpoint, api_key=azure_key or api_key,
                                             api_version=version, max_retries=0, timeout=timeout)
            self.endpoint = endpoint
        else:
            self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=timeout)
            self.endpoint = str(self.client.base_url)
        self.tokenizer_path = tokenizer
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else None
        self.context_limit = model_position_limit(tokenizer) if tokenizer else None  # lowered by the server's refusals
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="openai")
        self._lock = threading.Lock()
        self._abort = threading.Event()   # set while a failed batch winds down

    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        requests = single_if_greedy(self, requests, sampling)
        self._abort.clear()
        futures = [self._pool.submit(self._complete, r, sampling) for r in requests]
        try:
            result = [f.result() for f in futures]
        except BackendError:
            # The run stops on this error: the batch's other requests give up
            # at their next retry instead of retrying (and logging) after the
            # error has been reported.
            self._abort.set()
            concurrent.futures.wait(futures)
            self._abort.clear()
            raise
        except BaseException:
            self._abort.set()   # Ctrl-C: do not wait for requests in flight
            raise
        with self._lock:
            self.stats.calls += 1
            self.stats.requests += len(requests)
            self.stats.samples += sum(len(r) for r in result if isinstance(r, list))
        return result

    def _complete(self, request: GenerationRequest, sampling: SamplingConfig) -> list[str] | RequestFailed:
        texts: list[str] = []
        while len(texts) < request.n:
            want = request.n - len(texts)
            args: dict[str, Any] = dict(model=self.model, messages=chat_messages(request.messages), n=want,
                                        temperature=sampling.temperature, top_p=sampling.top_p,
                                        max_tokens=sampling.max_new_tokens)
            if sampling.stop:
                args["stop"] = list(sampling.stop)
            if request.seed is not None:  # a top-up call must not repeat the first call's samples
                args["seed"] = request.seed + len(texts)
            try:
                choices = self._call(args).choices
            except PromptTooLong as exc:
                return exc   # this request alone: the rest of the batch goes on
            if not choices:
                raise BackendError(f"OpenAI endpoint {self.endpoint} returned no choices for model {self.model!r}")
            texts += [cut_at_stop(c.message.content or "", sampling.stop) for c in choices[:want]]
        return texts

    def _call(self, args: dict[str, Any]) -> Any:
        oa = self._openai
        for attempt in range(self.max_retries + 1):
            if self._abort.is_set():
                raise BackendError(f"OpenAI request to {self.endpoint} abandoned: another request of the "
                                   "batch failed")
            try:
                return self.client.chat.completions.create(**args)
            except (oa.APIConnectionError, oa.RateLimitError, oa.InternalServerError, oa.APIStatusError) as exc:
                status = getattr(exc, "status_code", None)
                transient = status is None or status in (408, 409, 429) or status >= 500
                reason = self._redact(f"{type(exc).__name__}" + (f" (HTTP {status})" if status else ""))
                if not transient:
                    raise self._rejection(exc, status, reason) from None
                if attempt == self.max_retries:
                    raise BackendError(
                        f"OpenAI endpoint {self.endpoint} failed after {attempt + 1} attempts "
                        f"({self.max_retries} retries): last error {reason}. Is the server up and reachable?"
                    ) from None
                if self._abort.is_set():
                    continue   # abandoned at the top of the loop, without a retry logged
                delay = min(30.0, self.backoff * 2**attempt) * (0.5 + random.random())
                with self._lock:
                    self.stats.retries += 1
                log.warning("openai %s: %s; retry %d/%d in %.2fs", self.endpoint, reason, attempt + 1,
                            self.max_retries, delay)
                self._abort.wait(delay)
        raise AssertionError("unreachable")

    def _rejection(self, exc: Exception, status: int | None, reason: str) -> BackendError:
        """The error for a request the server refused (not worth a retry),
        with the hint that fits the status. A context-length refusal fails
        that request only, and teaches the backend the server's limit so the
        next prompts are truncated to fit."""
        detail = self._redact(_server_message(exc))
        where = f"OpenAI endpoint {self.endpoint} rejected the request: {reason}: {detail}"
        if status in (400, 413, 422) and _CONTEXT_ERROR.search(detail):
            limit = _CONTEXT_LIMIT.search(detail)
            if limit:
                with self._lock:
                    learned = int(limit.group(1))
                    self.context_limit = min(self.context_limit or learned, learned)
            return PromptTooLong(f"{where}. The prompt does not fit the served model's context"
                                 f"{f' of {self.context_limit} tokens' if self.context_limit else ''}.")
        hint = {401: "Check OPENAI_API_KEY (or AZURE_OPENAI_API_KEY).",
                403: "Check OPENAI_API_KEY (or AZURE_OPENAI_API_KEY): it has no access to this model.",
                404: "Check MODEL_NAME (the served model's name) and OPENAI_BASE_URL (it usually ends in /v1)."
                }.get(status or 0, "The server refused these request parameters (model, TEMP, N_GEN, "
                                   "max_new_tokens, stop): see its message above and its documentation.")
        return BackendError(f"{where}. {hint}")

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def count_tokens(self, messages: list[dict]) -> int:
        if self.tokenizer is not None:
            return chat_token_count(self.tokenizer, messages)
        return -(-sum(len(m["content"]) for m in messages) // 4) + 4 * len(messages)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model, "endpoint": self.endpoint,
                "max_concurrency": self.max_concurrency, "max_retries": self.max_retries,
                "tokenizer": self.tokenizer_path}

    def startup_line(self) -> str:
        return (f"backend openai | endpoint {self.endpoint} | model {self.model} | device and dtype: the server's | "
                f"token counts: {'the model tokenizer' if self.tokenizer else 'approximate (chars / 4)'}")
