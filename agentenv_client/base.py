"""The part every AgentGym HTTP client shares: one session, bounded retries, and
errors that say what went wrong and where.

AgentGym servers report most failures as HTTP 200 with ``{"error": ...}``; the
2024 clients asserted on status codes and crashed with no message. Here every
failure becomes an ``EnvServerError`` naming the server, endpoint and env id.

Replay. A tree search steps every child from a fresh reset plus a replay of
its parent's actions: over plain AgentGym endpoints that is one HTTP round trip
per action (about 1 ms of CPU each, client and server together; a TextCraft
tree made ~5,400 of them). ``replay(idx, actions)`` asks the server to do the
reset and all the steps in-process (``POST /replay``, which our servers answer)
and sends that request together with the next ``step`` when one follows, so a
replayed child costs one round trip. A server without the endpoint (AgentGym's:
404/405) is remembered per address, logged once, and gets the reset and the
steps one by one, exactly as before.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

log = logging.getLogger(__name__)

INSTRUCTION_DIR = Path(__file__).resolve().parent / "instructions"
CONNECT_TIMEOUT = 5.0
BACKOFF_START, BACKOFF_MAX = 0.1, 2.0

# Servers (by address) that answered POST /replay with 404/405: never asked again.
_NO_REPLAY: set[str] = set()
_NO_REPLAY_LOCK = threading.Lock()


def replay_unsupported(env_server_base: str) -> bool:
    return env_server_base.rstrip("/") in _NO_REPLAY


def _mark_no_replay(env_server_base: str, why: str) -> None:
    with _NO_REPLAY_LOCK:
        if env_server_base in _NO_REPLAY:
            return
        _NO_REPLAY.add(env_server_base)
    log.warning("%s has no POST /replay (%s; AgentGym's servers lack it): replaying with a reset and one "
                "step request per action", env_server_base, why)


class EnvClientUsageError(ValueError):
    """A client was given something unusable (a bad server address, a missing
    instruction file): the caller's mistake, shown as one line by scripts."""

    user_facing = True


class EnvServerError(RuntimeError):
    """The env server answered with an error (or with something unusable)."""

    def __init__(self, message: str, endpoint: str = "", env_id: Any = None, server_message: str | None = None,
                 status: int | None = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.env_id = env_id
        self.server_message = server_message   # the server's own error text, when it sent one
        self.status = status                   # HTTP status, when it was not 200


class EnvServerUnreachable(EnvServerError):
    """No server answers at the address: a setup problem the user must fix."""

    user_facing = True


@dataclass
class StepOutput:
    state: str
    reward: float
    done: bool


def load_instruction(env_name: str, instruction_file: str | None = None) -> str:
    """Our bundled instruction text, or the user's file, so models trained on
    other prompts keep theirs (scripts pass AGENTENV_INSTRUCTION_FILE here)."""
    path = instruction_file or None
    if path is None:
        return (INSTRUCTION_DIR / f"{env_name}.txt").read_text(encoding="utf-8").strip()
    if not os.path.isfile(path):
        raise EnvClientUsageError(f"instruction file {path} does not exist; fix the path given as instruction_file "
                                  "or in AGENTENV_INSTRUCTION_FILE, or unset it to use the bundled instruction")
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        raise EnvClientUsageError(f"instruction file {path} is empty; write the instruction text into it")
    return text


class BaseEnvClient:
    """One remote environment on an AgentGym server (created on construction)."""

    env_name = ""                 # bundled instruction file stem
    id_key = "id"                 # name of the env id field in requests
    start_hint = ""               # how to start a server (shown when unreachable)

    def __init__(self, env_server_base: str, data_len: int, timeout: float = 60.0, max_retries: int = 5,
                 instruction_file: str | None = None, replay: bool = True):
        self._pending: tuple[int, list[str]] | None = None   # a replay waiting for the next request
        self.use_replay = replay          # False: replay with reset + step requests even where /replay exists
        self.http_requests = 0            # HTTP requests sent (every attempt), for stats
        self.replay_requests = 0          # POST /replay requests that did a whole replay
        if not env_server_base or not env_server_base.startswith(("http://", "https://")):
            raise EnvClientUsageError(f"env server address {env_server_base!r} must start with http:// or https://, "
                             f"e.g. http://127.0.0.1:36001")
        self.env_server_base = env_server_base.rstrip("/")
        self.data_len = data_len
        self.timeout = timeout
        self.max_retries = max(1, max_retries)
        self.instruction = load_instruction(self.env_name, instruction_file)
        self.conversation_start = (
            {"from": "human", "loss": None, "value": self.instruction},
            {"from": "gpt", "loss": False, "value": "Ok."},
        )
        self.info = {}
        self.env_id: Any = None
        self._closed = False
        self._session = requests.Session()
        self.env_id = self._create()

    # ---- to implement per environment --------------------------------
    def _create(self) -> Any:
        raise NotImplementedError

    def reset(self, idx: int) -> dict:
        raise NotImplementedError

    def _wire_action(self, action: str) -> str:
        """The action as it is sent to the server (TextCraft cleans it)."""
        return action.strip()

    def _took_step(self, action: str, payload: Any) -> StepOutput:
        """Read a step answer (also the answer of a replay: its last step) and
        keep ``info`` current."""
        raise NotImplementedError

    def _replayed(self, payload: Any) -> None:
        """Anything else a replay answer carries (SciWorld: the latest look-around)."""

    def observe(self) -> str:
        return self.info["observation"]

    # ---- stepping and replay -------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """What the last reset or step returned (a pending replay is sent first)."""
        self._flush()
        return self._info

    @info.setter
    def info(self, value: dict[str, Any]) -> None:
        self._info = value

    def step(self, action: str) -> StepOutput:
        wire = self._wire_action(action)
        if self._pending is not None:
            (idx, actions), self._pending = self._pending, None
            return self._took_step(wire, self._replay_now(idx, actions + [wire]))
        return self._took_step(wire, self._post("step", {"action": wire}))

    def replay(self, idx: int, actions: list[str]) -> None:
        """Bring the env to task ``idx`` after ``actions``: what ``reset(idx)``
        and ``step`` of each action would do, with the same ``info`` after.
        Where the server has POST /replay this is one request, sent with the
        next request (a following ``step`` rides along in it); otherwise a
        reset and one step request per action, at once. A server error in the
        replay surfaces at that next request, as the reset's or a step's would."""
        wire = [self._wire_action(a) for a in actions]
        if self.use_replay and not replay_unsupported(self.env_server_base):
            self._pending = (int(idx), wire)
            return
        self._pending = None
        self._replay_by_steps(idx, wire)

    def _flush(self) -> None:
        if self._pending is None:
            return
        (idx, actions), self._pending = self._pending, None
        if actions:
            self._took_step(actions[-1], self._replay_now(idx, actions))
        else:
            self.reset(idx)

    def _replay_now(self, idx: int, actions: list[str]) -> Any:
        """POST /replay of ``actions`` from a reset of ``idx``; the answer is the
        last step's. Falls back to step requests when the server lacks it."""
        if not replay_unsupported(self.env_server_base):
            try:
                payload = self._post("replay", {"data_idx": int(idx), "actions": actions})
            except EnvServerError as exc:
                if exc.status not in (404, 405):
                    raise
                _mark_no_replay(self.env_server_base, f"HTTP {exc.status}")
            else:
                self.replay_requests += 1
                self._replayed(payload)
                return payload
        self._replay_by_steps(idx, actions[:-1])
        return self._post("step", {"action": actions[-1]})

    def _replay_by_steps(self, idx: int, actions: list[str]) -> None:
        self.reset(idx)
        for action in actions:
            self._took_step(action, self._post("step", {"action": action}))

    # ---- lifecycle ---------------------------------------------------------
    def __len__(self) -> int:
        return self.data_len

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Free the remote env. Idempotent; a dead server is only logged."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.env_id is not None:
                self._post("close", {}, retries=1)
        except EnvServerError as exc:
            log.warning("could not close %s env %s: %s", self.env_name, self.env_id, exc)
        finally:
            self._session.close()

    # ---- HTTP ----------------------------------------------------------------
    def _post(self, endpoint: str, data: dict, retries: int | None = None) -> Any:
        body = {**data, self.id_key: self.env_id} if self.env_id is not None else data
        return self._request("POST", endpoint, json_body=body, retries=retries)

    def _get(self, endpoint: str) -> Any:
        return self._request("GET", endpoint, params={self.id_key: self.env_id})

    def _request(self, method: str, endpoint: str, json_body: Any = None, params: dict | None = None,
                 retries: int | None = None) -> Any:
        if self._pending is not None and endpoint != "replay":
            if endpoint in ("reset", "close"):
                self._pending = None      # superseded: the env starts over or goes away
            else:
                self._flush()             # any other request needs the env where the replay leaves it
        url = f"{self.env_server_base}/{endpoint}"
        where = f"{self.env_name} server {self.env_server_base}, {method} /{endpoint}, env id {self.env_id}"
        attempts = retries or self.max_retries
        delay = BACKOFF_START
        for attempt in range(attempts):
            last = attempt == attempts - 1
            self.http_requests += 1
            try:
                res = self._session.request(method, url, json=json_body, params=params,
                                            timeout=(min(CONNECT_TIMEOUT, self.timeout), self.timeout))
            except requests.ConnectionError as exc:   # includes ConnectTimeout
                if last:
                    raise EnvServerUnreachable(
                        f"cannot reach the {self.env_name} environment server at {self.env_server_base} "
                        f"({type(exc).__name__} on /{endpoint}, {attempts} attempt(s)). Start one with "
                        f"{self.start_hint} or point --env_server_base at a running server.",
                        endpoint, self.env_id) from None
                log.info("%s unreachable (%s), retry %d/%d", url, type(exc).__name__, attempt + 1, attempts)
            except requests.exceptions.ReadTimeout:
                # Not retried: the server may already have executed the step.
                raise EnvServerError(f"{where}: no answer within {self.timeout:g}s (raise timeout=)",
                                     endpoint, self.env_id) from None
            else:
                if res.status_code != 503:
                    return self._decode(res, where, endpoint)
                if last:
                    raise EnvServerError(f"{where}: server busy (HTTP 503) after {attempts} tries",
                                         endpoint, self.env_id)
                log.info("%s busy (503), retry %d/%d", url, attempt + 1, attempts)
            time.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)
        raise AssertionError("unreachable")

    def _decode(self, res: requests.Response, where: str, endpoint: str) -> Any:
        text = res.text
        if res.status_code != 200:
            raise EnvServerError(f"{where}: HTTP {res.status_code}: {text[:300]}", endpoint, self.env_id, text,
                                 status=res.status_code)
        try:
            payload = json.loads(text)
        except json.JSONDecodeError:
            raise EnvServerError(f"{where}: malformed JSON in the answer: {text[:200]!r}",
                                 endpoint, self.env_id) from None
        if isinstance(payload, dict) and "error" in payload:
            msg = str(payload["error"])
            raise EnvServerError(f"{where}: {msg}", endpoint, self.env_id, msg)
        return payload

    def _field(self, payload: Any, key: str, endpoint: str) -> Any:
        """A required key of a server answer, or a clear error if it is missing."""
        if not isinstance(payload, dict) or key not in payload:
            raise EnvServerError(f"{self.env_name} server {self.env_server_base}, /{endpoint}, env id {self.env_id}: "
                                 f"answer lacks {key!r}: {str(payload)[:200]}", endpoint, self.env_id)
        return payload[key]
