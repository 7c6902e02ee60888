"""Helpers for the fault suite (tests/test_faults_*.py): run the three scripts
as a user does (subprocesses), restart a server on the same port, read what a
server process holds open. Real processes throughout; nothing here is a double."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.support.env_fixtures import ROOT, stop_server

# Env vars a developer's shell may carry that would change what a script does.
CLEARED = ("TASK", "ALPHA", "BETA", "TEMP", "MODEL_DIR", "MODEL_NAME", "MODEL_TYPE", "BACKEND", "MAX_TOKEN_LENGTH",
           "MAX_DEPTH", "ITERA", "N_GEN", "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_TIMEOUT",
           "OPENAI_MAX_RETRIES", "AZURE_OPENAI_ENDPOINT", "SEARCH_DOUBLE_SLEEP", "LATENCY_PER_CALL",
           "LATENCY_PER_TOKEN")
SEARCH_DOUBLE = "python:tests.support.search_doubles:seeded_textcraft_backend"
TABLE = "python:tests.support.doubles:table_backend"
LATENCY_TABLE = "python:tests.support.doubles:latency_table_backend"


def script_env(env: dict | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    base.update({"PYTHONPATH": str(ROOT), "LOGLEVEL": "WARNING", "OMP_NUM_THREADS": "1"})
    base.update({k: str(v) for k, v in (env or {}).items()})
    return base


def run_script(script: str, *args, env: dict | None = None, wait: bool = True, timeout: float = 300):
    """``python <script> args`` in the repo root; a CompletedProcess, or the
    Popen when ``wait`` is False."""
    cmd = [sys.executable, str(ROOT / script), *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=script_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(cmd, cwd=ROOT, env=script_env(env), capture_output=True, text=True, timeout=timeout)


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
            except requests.ConnectionError:
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

