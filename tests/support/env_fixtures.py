"""Real local env servers for tests: started as processes on 127.0.0.1 with a
free port, ready once /health answers, killed at the end.

``TEST_TEXTCRAFT_SERVER`` / ``TEST_SCIWORLD_SERVER`` (a URL) make the session
fixtures use an already running server instead (bench/mutation.py runs the
suite once per mutant and starts each server once for all of them)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(module: str, *args: str, env: dict | None = None, timeout: float = 90.0):
    """Start ``python -m module --host 127.0.0.1 --port <free> *args``; return
    (process, base url) once GET /health answers."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix=f"{module}.", suffix=".log", delete=False)
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *args],
                            cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log.name  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited with {proc.returncode}:\n{Path(log.name).read_text()[-2000:]}")
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except (requests.ConnectionError, requests.Timeout):   # not up yet, or too busy to answer in 1 s
            pass
        time.sleep(0.1)
    stop_server(proc)
    raise RuntimeError(f"{module} did not answer on {url} within {timeout}s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if getattr(proc, "log_path", None):
        Path(proc.log_path).unlink(missing_ok=True)


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def session_server(module: str, reuse_var: str):
    if os.environ.get(reuse_var):
        yield os.environ[reuse_var]
        return
    proc, url = start_server(module)
    yield url
    stop_server(proc)


@pytest.fixture(scope="session")
def textcraft_server():
    yield from session_server("agentenv_servers.textcraft", "TEST_TEXTCRAFT_SERVER")


@pytest.fixture(scope="session")
def sciworld_server():
    yield from session_server("agentenv_servers.sciworld", "TEST_SCIWORLD_SERVER")
