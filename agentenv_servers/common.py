"""What both local servers share: a capped table of live envs, AgentGym's error
convention (HTTP 200 + {"error": ...}), /health, JSON errors for malformed
requests, and the command line.

Besides AgentGym's endpoints both servers answer ``POST /replay`` (``{"id",
"data_idx", "actions": [...]}``): a reset to ``data_idx`` and a step of every
action, in-process, answered with what the last step (or, with no actions, the
reset) answers plus ``"steps"``, the number of actions stepped. A step that
fails stops the replay with that step's error, as the step request would. It
saves a tree search one HTTP round trip per replayed action (agentenv_client
uses it and falls back to steps where a server lacks it). ``--no-replay``
starts a server without it, as AgentGym's are."""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import logging
import random
import re
import threading
from typing import Any, Callable, Generic, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

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


MAX_REPLAY_ACTIONS = 10_000   # far beyond any episode; keeps one request from holding a server for long


class ReplayBody(BaseModel):
    id: int
    data_idx: int = 0
    actions: list[str] = []


def check_replay(body: ReplayBody) -> None:
    if len(body.actions) > MAX_REPLAY_ACTIONS:
        raise EnvError(f"a replay takes at most {MAX_REPLAY_ACTIONS} actions, got {len(body.actions)}: "
                       "reset and step the rest one by one")


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
    """GET /health, and the JSON-error rules every local server follows
    (``install_json_errors``): both servers call this right after making
    their app."""
    install_json_errors(app)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "env": name, "live_envs": len(table), "max_envs": table.max_envs}


# ---- malformed requests: always a JSON error that names the problem --------
#
# FastAPI's own answers to a malformed request are JSON ({"detail": ...}), but
# a body holding a lone surrogate ("\ud800": valid JSON, not valid Unicode, and
# models do emit it) got past validation and crashed the response encoder: a
# bare "500 Internal Server Error" in text. Such bodies are refused up front;
# every refusal keeps FastAPI's status and "detail" and adds an "error" line
# saying what is wrong, the key AgentGym's clients read.

_SURROGATE = re.compile("[\ud800-\udfff]")


class SafeJSONResponse(JSONResponse):
    """JSON that always encodes: a lone surrogate quoted back from a bad
    request is written as its \\uXXXX escape (still valid JSON)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
            "utf-8", errors="backslashreplace")


def error_response(status: int, message: str, detail: Any = None) -> SafeJSONResponse:
    body = {"error": message}
    if detail is not None:
        body["detail"] = detail
    return SafeJSONResponse(body, status_code=status)


def lone_surrogate(value: Any, where: str = "body") -> str | None:
    """Where the first lone surrogate in a decoded JSON value sits, as
    "<field path>: ... at character N", or None."""
    if isinstance(value, str):
        m = _SURROGATE.search(value)
        return f"{where} holds a lone surrogate {m.group()!r} at character {m.start()}" if m else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = (lone_surrogate(key, f"a key of {where}") if isinstance(key, str) else None) or \
            lone_surrogate(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]")
        if found:
            return found
    return None


class RefuseLoneSurrogates:
    """ASGI middleware: a JSON body holding a lone surrogate is answered 422
    with the field it sits in. (A plain ASGI class, not @app.middleware: it
    costs nothing on the hot /step path but one substring test.)"""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, message = [], {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            if message["type"] != "http.request":   # the client went away
                return
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
        if b"\\u" in body:   # a surrogate can only arrive \u-escaped (raw ones are not UTF-8)
            try:
                found = lone_surrogate(json.loads(body))
            except (ValueError, RecursionError):
                found = None   # not JSON: the validation error names that
            if found:
                response = error_response(422, f"{scope['method']} {scope['path']}: {found}, which is not valid "
                                          "Unicode text; send valid UTF-8 (drop or replace that character)")
                return await response(scope, receive, send)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _shown(value: Any) -> str:
    """A short JSON rendering of what the client sent (bytes/odd objects as text)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _jsonable(err: dict) -> dict:
    out = {k: v for k, v in err.items() if k in ("type", "loc", "msg", "input", "ctx")}
    if isinstance(out.get("input"), (bytes, bytearray)):
        out["input"] = bytes(out["input"]).decode("utf-8", errors="replace")
    try:
        json.dumps(out.get("input"))
    except (TypeError, ValueError):
        out["input"] = repr(out["input"])
    if "ctx" in out:
        out["ctx"] = {k: str(v) for k, v in out["ctx"].items()}
    return out


def describe_validation(errors: list[dict]) -> str:
    """FastAPI's validation errors as one line: which field, what is wrong."""
    parts = []
    for err in errors:
        loc, kind = [str(x) for x in err.get("loc", ())], err.get("type")
        got = _shown(err.get("input"))
        if kind == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', err.get('msg'))} at "
                         f"character {loc[-1] if len(loc) > 1 else '?'})")
        elif loc == ["body"]:
            hint = " (send it as JSON with Content-Type: application/json)" if isinstance(err.get("input"), (str, bytes)) else ""
            parts.append(f"the body must be a JSON object, got {got}{hint}")
        else:
            where = {"body": "body field", "query": "query parameter"}.get(loc[0] if loc else "", "field")
            name = ".".join(loc[1:]) or "?"
            parts.append(f"{where} {name} is missing" if kind == "missing" else
                         f"{where} {name}: {err.get('msg', 'invalid')} (got {got})")
    return "; ".join(parts) or "invalid request"


def install_json_errors(app: FastAPI) -> None:
    """Every refusal of a malformed request is JSON with an "error" line
    naming the problem (a field, bad JSON, a lone surrogate, a wrong method or
    path); an unexpected failure is a JSON 500, never a bare text page."""

    app.add_middleware(RefuseLoneSurrogates)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = [_jsonable(err) for err in exc.errors()]
        return error_response(422, f"{request.method} {request.url.path}: {describe_validation(errors)}", errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = {404: f"no endpoint {request.url.path} (see GET /docs for the endpoints)",
                   405: f"{request.url.path} does not take {request.method}"}.get(exc.status_code, str(exc.detail))
        if exc.__cause__ is not None:   # e.g. a body that is not UTF-8
            message = f"{exc.detail}: {type(exc.__cause__).__name__}: {exc.__cause__}"
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {message}", exc.detail)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, f"{request.method} {request.url.path}: internal error: "
                              f"{type(exc).__name__}: {exc}")


def serve(make_app: Callable[..., FastAPI], name: str, default_port: int, default_max_envs: int,
          argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m agentenv_servers.{name}",
                                     description=f"Local AgentGym-compatible {name} environment server.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=default_port, help=f"port (default {default_port})")
    parser.add_argument("--max-envs", type=int, default=default_max_envs,
                        help=f"most live environments at once (default {default_max_envs})")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    parser.add_argument("--no-replay", action="store_true",
                        help="do not answer POST /replay (behave as AgentGym's server: clients replay step by step)")
    args = parser.parse_args(argv)
    if args.max_envs < 1:
        parser.error("--max-envs must be >= 1")
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"{name} server on http://{args.host}:{args.port} (max {args.max_envs} envs"
          f"{', no /replay' if args.no_replay else ''})", flush=True)
    uvicorn.run(make_app(args.max_envs, replay=not args.no_replay), host=args.host, port=args.port,
                log_level=args.log_level)
