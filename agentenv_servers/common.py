"""What both local servers share: a capped table of live envs, AgentGym's error
convention (HTTP 200 + {"error": ...}), /health, and the command line."""
from __future__ import annotations

import argparse
import functools
import inspect
import logging
import random
import threading
from typing import Any, Callable, Generic, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel

log = logging.getLogger(__name__)
E = TypeVar("E")


class EnvError(Exception):
    """A request the server refuses; sent back as {"error": message}."""


class IdBody(BaseModel):
    id: int


class ResetBody(BaseModel):
    id: int
    data_idx: int = 0


class StepBody(BaseModel):
    id: int
    action: str


class EnvTable(Generic[E]):
    """Live envs by id. Ids are never reused, so a stale id cannot reach a new
    env; they start at a random offset, so neither can a client's id from
    before a server restart (it gets "not valid" and the client starts over)."""

    def __init__(self, max_envs: int, close_env: Callable[[E], None] = lambda env: None):
        self.max_envs = max_envs
        self._close_env = close_env
        self._envs: dict[int, E] = {}
        self._next_id = random.SystemRandom().randrange(1 << 30) * 1024
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._envs)

    def reserve(self) -> int:
        with self._lock:
            if len(self._envs) >= self.max_envs:
                raise EnvError(f"too many live environments ({self.max_envs}): close some with POST /close, "
                               f"or restart the server with a larger --max-envs")
            env_id = self._next_id
            self._next_id += 1
            self._envs[env_id] = None  # type: ignore[assignment]  # placeholder until built
            return env_id

    def put(self, env_id: int, env: E) -> None:
        self._envs[env_id] = env

    def get(self, env_id: int) -> E:
        env = self._envs.get(env_id)
        if env is None:
            raise EnvError(f"The id {env_id} is not valid: no live environment has it (create one with POST /create)")
        return env

    def close(self, env_id: int) -> bool:
        with self._lock:
            env = self._envs.pop(env_id, None)
        if env is None:
            return False
        self._close_env(env)
        return True

    def close_all(self) -> None:
        for env_id in list(self._envs):
            self.close(env_id)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run an endpoint body; refusals and env failures become {"error": ...}.
    Works for sync endpoints (run in FastAPI's thread pool: slow envs) and async
    ones (run on the event loop: envs that answer in microseconds)."""

    def as_error(exc: Exception) -> dict:
        if not isinstance(exc, EnvError):   # AgentGym servers report env failures this way
            log.exception("%s failed", fn.__name__)
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"error": str(exc)}

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                return as_error(exc)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            return as_error(exc)

    return wrapper


def add_health(app: FastAPI, name: str, table: EnvTable) -> None:
    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "env": name, "live_envs": len(table), "max_envs": table.max_envs}


def serve(make_app: Callable[[int], FastAPI], name: str, default_port: int, default_max_envs: int,
          argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m agentenv_servers.{name}",
                                     description=f"Local AgentGym-compatible {name} environment server.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=default_port, help=f"port (default {default_port})")
    parser.add_argument("--max-envs", type=int, default=default_max_envs,
                        help=f"most live environments at once (default {default_max_envs})")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    args = parser.parse_args(argv)
    if args.max_envs < 1:
        parser.error("--max-envs must be >= 1")
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"{name} server on http://{args.host}:{args.port} (max {args.max_envs} envs)", flush=True)
    uvicorn.run(make_app(args.max_envs), host=args.host, port=args.port, log_level=args.log_level)
