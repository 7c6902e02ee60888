"""One driver for batched model work over many env-bound jobs (MCTS trees,
eval episodes, anything else that alternates "ask the model" and "act in an
env").

A job is an object with a ``key`` and a ``run(client)`` generator: it yields a
GenerationRequest, is sent that request's samples, and returns its result.
``run_jobs`` keeps up to ``concurrency`` jobs in flight, answers the pending
requests of ALL of them with ONE ``backend.generate`` call, then lets every
job do its env work at the same time in a thread pool, each on its own client.
Model calls dominate wall time, so batching them is the speed-up; env work
overlaps in threads.

The rules, in one place:
* Retry: an env error (the server's error, a dropped connection) discards the
  job's client and restarts the job from scratch on a fresh client, at most
  ``env_retries`` times, ``env_retry_delay * 2**k`` seconds apart; then the job
  fails alone.
* Fatal: a user-facing error (an unreachable server after those restarts, a
  usage mistake) stops the run: every other job would fail the same way. A
  backend failure stops the run too.
* Output check: the backend must answer every request with >= 1 sample.
  A request the backend could not serve on its own (llm.RequestFailed, e.g.
  a prompt longer than the model's context) fails that job alone: the
  error is raised inside it, and it ends like a job that raised.
* Clean-up: on any exit (also Ctrl-C) every job still running is closed and
  every client freed, after the pool has finished its env work.

Determinism is the jobs' business: they derive request seeds from their own
key and position, never from batch composition, so ``concurrency`` changes
speed, not results.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Protocol

from agent_r.conversation import truncate
from agent_r.llm import (Backend, BackendError, GenerationRequest, PromptTooLong, RequestFailed, SamplingConfig,
                         duplicate_watch, single_if_greedy)
from agent_r.settings import UsageError

log = logging.getLogger(__name__)


class Job(Protocol):
    key: str

    def run(self, client: Any) -> Generator[GenerationRequest, list[str], Any]: ...


@dataclass
class Outcome:
    job: Any
    result: Any = None
    error: BaseException | None = None
    restarts: int = 0


@dataclass
class DriverStats:
    model_calls: int = 0        # backend.generate invocations made by this driver
    requests: int = 0           # conversations sent
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def mean_batch(self) -> float:
        return self.requests / self.model_calls if self.model_calls else 0.0


@dataclass
class DriverConfig:
    sampling: SamplingConfig
    max_token_length: int        # prompts are truncated to this (conversation.truncate)
    concurrency: int = 8
    env_retries: int = 2
    env_retry_delay: float = 1.0


def env_errors() -> tuple[type[BaseException], ...]:
    """Errors worth a fresh env: the server's (EnvServerError, including an
    unreachable server) and the HTTP layer's. Programming errors are not."""
    import requests

    from agentenv_client import EnvServerError

    return (EnvServerError, requests.RequestException)


def is_fatal(exc: BaseException) -> bool:
    """A job that failed this way means every other job will too."""
    return isinstance(exc, UsageError) or bool(getattr(exc, "user_facing", False))


def close_quietly(thing: Any, what: str = "env client") -> None:
    if thing is None:
        return
    try:
        thing.close()
    except Exception:  # noqa: BLE001 - closing is best effort (the server may be gone)
        log.debug("closing %s failed", what, exc_info=True)


class _Clients:
    """Idle env clients, reused by later jobs (a SciWorld client owns a JVM)."""

    def __init__(self, make_client: Callable[[], Any], idle: list[Any]):
        self.make_client, self.idle, self.lock = make_client, list(idle), threading.Lock()

    def take(self) -> Any:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return self.make_client()

    def give_back(self, client: Any) -> None:
        with self.lock:
            self.idle.append(client)

    def close_all(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for client in idle:
            close_quietly(client)


class _Slot:
    """A job in flight: its generator, its client, its restarts."""

    def __init__(self, job: Any):
        self.job, self.gen, self.client, self.restarts = job, None, None, 0

    def discard(self) -> None:
        if self.gen is not None:
            try:
                self.gen.close()
            except Exception:  # noqa: BLE001 - one job's cleanup must not stop the others'
                log.warning("job %s: could not stop cleanly", self.job.key, exc_info=True)
        close_quietly(self.client)
        self.gen = self.client = None

    def advance(self, value: list[str] | RequestFailed | None, clients: _Clients, cfg: DriverConfig) -> Any:
        """Run the job to its next request (returned), or to its end (an Outcome)."""
        while True:
            try:
                if self.gen is None:
                    self.client = self.client or clients.take()
                    self.gen, value = self.job.run(self.client), None
                if isinstance(value, RequestFailed):   # the model could not answer this job: it fails alone
                    return self.gen.throw(value)
                return self.gen.send(value)
            except StopIteration as stop:
                return Outcome(self.job, stop.value, None, self.restarts)
            except env_errors() as exc:
                self.discard()
                if self.restarts >= cfg.env_retries:
                    return Outcome(self.job, None, exc, self.restarts)
                delay = cfg.env_retry_delay * 2 ** self.restarts
                self.restarts += 1
                log.warning("job %s: env error (%s); restarting it on a fresh env in %.1fs (retry %d/%d)",
                            self.job.key, exc, delay, self.restarts, cfg.env_retries)
                time.sleep(delay)
            except Exception as exc:  # noqa: BLE001 - a failed job is reported; is_fatal decides the run
                self.discard()
                return Outcome(self.job, None, exc, self.restarts)


def generate_checked(backend: Backend, requests: list[GenerationRequest], sampling: SamplingConfig,
                     max_token_length: int | None = None, allow_failures: bool = False
                     ) -> list[list[str] | RequestFailed]:
    """One backend call for ``requests``, checked: every request gets at
    least one sample, or (``allow_failures``) a RequestFailed in its place
    that fails only its own item; otherwise a failed request stops the run
    with the backend's reason. Greedy requests ask for one sample (llm.
    single_if_greedy). With ``max_token_length`` the prompts are truncated to
    the budget that fits the backend's context (Backend.prompt_budget), and
    a prompt the server refuses as too long is truncated further and resent
    once when the refusal taught a tighter limit. Truncation runs in the
    caller's thread: a tokenizer is not safe to share across threads."""
    requests = single_if_greedy(backend, requests, sampling)
    if max_token_length is not None:
        budget = backend.prompt_budget(max_token_length, sampling.max_new_tokens)
        requests = [_truncated(backend, r, budget) for r in requests]
    outputs = _answers(backend, requests, sampling)
    if max_token_length is not None:
        outputs = _retry_tighter(backend, requests, outputs, sampling, max_token_length, budget)
    duplicate_watch(backend).observe(backend, outputs, sampling)
    failed = [o for o in outputs if isinstance(o, RequestFailed)]
    if failed and not allow_failures:
        raise BackendError(f"backend {backend.name}: {len(failed)} of {len(requests)} requests failed: {failed[0]}")
    return [o if isinstance(o, RequestFailed) else list(o) for o in outputs]


def _answers(backend: Backend, requests: list[GenerationRequest], sampling: SamplingConfig) -> list:
    """``backend.generate``, refused unless it answers every request (with
    samples, or a RequestFailed in its place): a request left unanswered
    would leave its job waiting forever and vanish from the run unreported."""
    outputs = list(backend.generate(requests, sampling))
    if len(outputs) != len(requests) or any(not isinstance(o, RequestFailed) and len(o) < 1 for o in outputs):
        got = sum(1 for o in outputs if isinstance(o, RequestFailed) or len(o) >= 1)
        raise BackendError(f"backend {backend.name} answered {got} of {len(requests)} requests")
    return outputs


def _truncated(backend: Backend, request: GenerationRequest, budget: int) -> GenerationRequest:
    return GenerationRequest(truncate(request.messages, budget, backend.count_tokens), request.n, request.seed)


def _retry_tighter(backend: Backend, requests: list[GenerationRequest], outputs: list, sampling: SamplingConfig,
                   max_token_length: int, budget: int) -> list:
    """Resend, once, the too-long prompts that a tighter budget shortens (a
    server's refusal tells the backend its real context limit)."""
    tighter = backend.prompt_budget(max_token_length, sampling.max_new_tokens)
    if tighter >= budget:
        return outputs
    again = {i: _truncated(backend, requests[i], tighter) for i, o in enumerate(outputs)
             if isinstance(o, PromptTooLong)}
    again = {i: r for i, r in again.items() if len(r.messages) < len(requests[i].messages)}
    if not again:
        return outputs
    log.info("resending %d prompt(s) truncated to the %d-token budget the server's context allows", len(again),
             tighter)
    outputs = list(outputs)
    for i, out in zip(again, _answers(backend, list(again.values()), sampling)):
        outputs[i] = out
    return outputs


def run_jobs(jobs: Iterable[Any], backend: Backend | None, make_client: Callable[[], Any], cfg: DriverConfig,
             on_done: Callable[[Outcome], None], clients: list[Any] | None = None) -> DriverStats:
    """Run every job (see the module docstring for the rules); ``on_done`` gets
    each finished or failed job, in the driver's thread, as it ends."""
    if cfg.concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    stats, queue, pool_clients = DriverStats(), deque(jobs), _Clients(make_client, clients or [])
    live: list[_Slot] = []
    answered: list[tuple[_Slot, list[str]]] = []
    try:
        with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="job") as pool:
            step = lambda item: item[0].advance(item[1], pool_clients, cfg)  # noqa: E731
            while queue or answered:
                waiting = _next_requests(queue, live, answered, lambda batch: list(pool.map(step, batch)),
                                         pool_clients, on_done, cfg.concurrency)
                answered = []
                if waiting:
                    outputs = generate_checked(backend, [r for _, r in waiting], cfg.sampling, cfg.max_token_length,
                                               allow_failures=True)
                    stats.model_calls += 1
                    stats.requests += len(waiting)
                    stats.batch_sizes.append(len(waiting))
                    answered = [(slot, out) for (slot, _), out in zip(waiting, outputs)]
    finally:
        # The pool has shut down (it waits for running env work, also on
        # Ctrl-C), so no job is executing: closing frees every remote env.
        for slot in live:
            slot.discard()
        pool_clients.close_all()
    return stats


def _next_requests(queue: deque, live: list[_Slot], answered: list, advance: Callable[[list], list],
                   clients: _Clients, on_done: Callable[[Outcome], None], concurrency: int) -> list:
    """Advance every answered job to its next request; jobs that end free their
    slot, and queued jobs start in it before the model call, so the next batch
    is full (a new job joins this round, not the next)."""
    runnable: list = list(answered)
    waiting: list = []
    while True:
        while queue and len(live) < concurrency:
            live.append(_Slot(queue.popleft()))
            runnable.append((live[-1], None))
        if not runnable:
            return waiting
        waiting += _finish(runnable, advance(runnable), live, clients, on_done)
        runnable = []


def _finish(runnable: list, steps: list, live: list[_Slot], clients: _Clients,
            on_done: Callable[[Outcome], None]) -> list[tuple[_Slot, GenerationRequest]]:
    """Report the jobs that ended; return the ones waiting for the model."""
    waiting, fatal = [], None
    for (slot, _), step in zip(runnable, steps):
        if not isinstance(step, Outcome):
            waiting.append((slot, step))
            continue
        live.remove(slot)
        if slot.client is not None:
            clients.give_back(slot.client)
            slot.client = None
        on_done(step)
        if step.error is not None and is_fatal(step.error):
            fatal = step.error
    if fatal is not None:
        raise fatal
    return waiting
