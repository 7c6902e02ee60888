"""The part every AgentGym HTTP client shares: one session, bounded retries, and
errors that say what went wrong and where.

AgentGym servers report most failures as HTTP 200 with ``{"error": ...}``; the
2024 clients asserted on status codes and crashed with no message. Here every
failure becomes an ``EnvServerError`` naming the server, endpoint and env id.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

log = logging.getLogger(__name__)

INSTRUCTION_DIR = Path(__file__).resolve().parent / "instructions"
CONNECT_TIMEOUT = 5.0
BACKOFF_START, BACKOFF_MAX = 0.1, 2.0


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
                 instruction_file: str | None = None):
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
        self.info: dict[str, Any] = {}
        self.env_id: Any = None
        self._closed = False
        self._session = requests.Session()
        self.env_id = self._create()

    # ---- to implement per environment --------------------------------
    def _create(self) -> Any:
        raise NotImplementedError

    def reset(self, idx: int) -> dict:
        raise NotImplementedError

    def step(self, action: str) -> StepOutput:
        raise NotImplementedError

    def observe(self) -> str:
        return self.info["observation"]

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
        url = f"{self.env_server_base}/{endpoint}"
        where = f"{self.env_name} server {self.env_server_base}, {method} /{endpoint}, env id {self.env_id}"
        attempts = retries or self.max_retries
        delay = BACKOFF_START
        for attempt in range(attempts):
            last = attempt == attempts - 1
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
