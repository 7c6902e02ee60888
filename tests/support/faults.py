"""Helpers for the fault suite (tests/test_faults_*.py): run the three scripts
as a user does (subprocesses), restart a server on the same port, read what a
server process holds open, and hold a run at a known point (``Gate``).

Gates replace sleeps. A test that must interrupt, kill or disturb a run
mid-way starts it with ``--backend GATED`` and a Gate's env vars; the run
stops at the gate (before a given model call, or inside a given atomic write
between its complete temp file and the rename), says so by writing
``reached``, and waits until the test writes ``release``. The test acts
(SIGINT, SIGKILL, kills the env server) while the run provably stands at that
point, so no outcome depends on how fast a busy machine runs. Real processes
throughout; the gated backend wraps a test double and is named as one.
"""
from __future__ import annotations

import glob
import importlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import requests

from agent_r.llm import Backend, GenerationRequest, SamplingConfig
from tests.support.env_fixtures import ROOT, stop_server

# Env vars a developer's shell may carry that would change what a script does.
CLEARED = ("TASK", "ALPHA", "BETA", "TEMP", "MODEL_DIR", "MODEL_NAME", "MODEL_TYPE", "BACKEND", "MAX_TOKEN_LENGTH",
           "MAX_DEPTH", "ITERA", "N_GEN", "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_TIMEOUT",
           "OPENAI_MAX_RETRIES", "AZURE_OPENAI_ENDPOINT", "SEARCH_DOUBLE_SLEEP", "LATENCY_PER_CALL",
           "LATENCY_PER_TOKEN", "GATE_DIR", "GATE_INNER", "GATE_CALL", "GATE_FILES", "GATE_WRITE")
SEARCH_DOUBLE = "python:tests.support.search_doubles:seeded_textcraft_backend"
TABLE = "python:tests.support.doubles:table_backend"
LATENCY_TABLE = "python:tests.support.doubles:latency_table_backend"
GATED = "python:tests.support.faults:gated_backend"
SEARCH_INNER = "tests.support.search_doubles:seeded_textcraft_backend"
TABLE_INNER = "tests.support.doubles:table_backend"


def script_env(env: dict | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep a tool's own (mutmut)
    base.update({"PYTHONPATH": path, "LOGLEVEL": "WARNING", "OMP_NUM_THREADS": "1"})
    base.update({k: str(v) for k, v in (env or {}).items()})
    return base


def run_script(script: str, *args, env: dict | None = None, wait: bool = True, timeout: float = 300):
    """``python <script> args`` in the repo root; a CompletedProcess, or the
    Popen when ``wait`` is False."""
    path = ROOT / script
    # a file inside a package (bench/) runs as its module, so its imports resolve from the repo root
    target = ["-m", ".".join(path.relative_to(ROOT).with_suffix("").parts)] if (path.parent / "__init__.py").exists() \
        else [str(path)]
    cmd = [sys.executable, *target, *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=script_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=sigint_as_at_a_terminal)
    return subprocess.run(cmd, cwd=ROOT, env=script_env(env), capture_output=True, text=True, timeout=timeout)


def sigint_as_at_a_terminal() -> None:
    """A run a test interrupts gets SIGINT's default disposition, as a run
    started at a terminal has. A shell starts background jobs (`make test &`,
    nohup) with SIGINT ignored, the ignore is inherited through exec, and a
    Python started that way never turns Ctrl-C into KeyboardInterrupt: the
    SIGINT tests would then wait for an exit that cannot come."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout: float = 120, what: str = "condition") -> None:
    """Poll until ``predicate()``; fail early if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def files(folder: Path, pattern: str = "search_results_*.json") -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).glob(pattern))}


def start_server_on(module: str, port: int, *args: str, timeout: float = 90.0) -> subprocess.Popen:
    """Start ``module`` on a given port (a restart after a crash): retried while
    the old socket is still being released."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args],
                                cwd=ROOT, env=script_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return proc
            except (requests.ConnectionError, requests.Timeout):   # not up yet, or too busy to answer in 1 s
                pass
            time.sleep(0.05)
        if time.monotonic() >= deadline:
            stop_server(proc)
            raise RuntimeError(f"{module} did not come back on port {port}")
        time.sleep(0.2)  # the port was still taken: try again


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    proc.send_signal(sig)
    proc.wait()


def live_envs(url: str) -> int:
    return requests.get(f"{url}/health", timeout=5).json()["live_envs"]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def listen_addresses(pid: int, port: int) -> set[str]:
    """Local IPv4/IPv6 addresses a process listens on for ``port`` (from
    /proc/<pid>/net/tcp*, state 0A = LISTEN), as hex strings."""
    found = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found



# ---- gates: hold a run at a known point ------------------------------------

GATE_LIMIT_S = 600.0   # a gate nobody releases ends the run: a broken test must not hang CI forever


class Gate:
    """The test's side of a gate: a folder in which the run writes
    ``reached`` (what it stopped at) and then waits for ``release``.

    Points (keyword arguments of ``env``); the first one met holds the run, once:

    * ``call=N``: before the N-th model call;
    * ``files=(glob, N)``: before the first model call at which ``glob`` (an
      absolute pattern) matches N or more files, i.e. after the N-th output
      (outputs are written between model calls, in the driver's thread);
    * ``write=(regex, N)``: inside the N-th atomic write whose target's file
      name matches ``regex``: its temp file is written and synced, the rename
      has not happened.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def env(self, inner: str, call: int | None = None, files: tuple[Any, int] | None = None,
            write: tuple[str, int] | None = None) -> dict:
        env = {"GATE_DIR": str(self.folder), "GATE_INNER": inner}
        if call is not None:
            env["GATE_CALL"] = str(call)
        if files is not None:
            env["GATE_FILES"] = f"{files[1]}:{files[0]}"
        if write is not None:
            env["GATE_WRITE"] = f"{write[1]}:{write[0]}"
        return env

    def wait(self, proc: subprocess.Popen, timeout: float = 240) -> str:
        """Block until the run stands at the gate; returns what it stopped at.
        Fails with the run's stderr if the run ends first."""
        wait_for(lambda: (self.folder / "reached").exists(), proc, timeout=timeout, what="the run to reach its gate")
        return (self.folder / "reached").read_text()

    def release(self) -> None:
        (self.folder / "release").touch()


def _hold(folder: Path, what: str) -> None:
    """The run's side: announce the stop (atomically, so the test reads it
    whole), then wait for the release. A signal sent meanwhile lands here
    (SIGINT raises KeyboardInterrupt in this loop: it runs in the main thread)."""
    tmp = folder / "reached.tmp"
    tmp.write_text(what)
    _REAL_REPLACE(tmp, folder / "reached")
    deadline = time.monotonic() + GATE_LIMIT_S
    while not (folder / "release").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"test gate in {folder} was never released")
        time.sleep(0.01)


_REAL_REPLACE = os.replace


class GatedBackend(Backend):
    """Test double wrapper (not a model): the test backend ``GATE_INNER``
    names, held once at the point the gate's env vars describe. Transparent
    otherwise: same name, stats, description and outputs."""

    def __init__(self, inner: Backend, folder: Path, call: int | None = None,
                 files: tuple[str, int] | None = None, write: tuple[re.Pattern, int] | None = None):
        super().__init__()
        self.inner, self.folder = inner, folder
        self.name, self.stats = inner.name, inner.stats
        self.call, self.files, self.held, self.calls = call, files, False, 0
        if write is not None:
            self._gate_writes(*write)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        self.calls += 1
        due = self.call is not None and self.calls >= self.call
        if self.files is not None and not due:
            due = len(glob.glob(self.files[0])) >= self.files[1]
        if due and not self.held:
            self.held = True
            _hold(self.folder, f"model call {self.calls}")
        return self.inner.generate(requests, sampling)

    def count_tokens(self, messages: list[dict]) -> int:
        return self.inner.count_tokens(messages)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()

    def _gate_writes(self, pattern: re.Pattern, nth: int) -> None:
        """Every atomic write (agent_r.io) ends with os.replace(temp, target):
        holding inside the nth matching rename is "temp file complete, target
        not yet replaced". Patched in this (the run's) process only."""
        seen = [0]

        def replace(src, dst, *args, **kwargs):
            if pattern.search(os.path.basename(os.fspath(dst))):
                seen[0] += 1
                if seen[0] == nth and not self.held:
                    self.held = True
                    _hold(self.folder, f"write {os.fspath(src)} -> {os.fspath(dst)}")
            return _REAL_REPLACE(src, dst, *args, **kwargs)

        os.replace = replace


def gated_backend(model_dir: Any = None, **options: Any) -> GatedBackend:
    """``--backend python:tests.support.faults:gated_backend`` with a Gate's
    env vars; ``GATE_INNER`` = ``module:factory`` of the wrapped test backend
    (called as any python: backend is)."""
    module, _, factory = os.environ["GATE_INNER"].partition(":")
    inner = getattr(importlib.import_module(module), factory)(model_dir, **options)
    call, files, write = os.environ.get("GATE_CALL"), None, None
    if os.environ.get("GATE_FILES"):
        n, _, pattern = os.environ["GATE_FILES"].partition(":")
        files = (pattern, int(n))
    if os.environ.get("GATE_WRITE"):
        n, _, regex = os.environ["GATE_WRITE"].partition(":")
        write = (re.compile(regex), int(n))
    return GatedBackend(inner, Path(os.environ["GATE_DIR"]), int(call) if call else None, files, write)
