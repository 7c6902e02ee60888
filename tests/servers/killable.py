"""A TextCraft server a test may kill and restart on the same port (the
shared session server must stay up for the other tests)."""
from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.support.env_fixtures import start_server, stop_server
from tests.support.faults import kill, start_server_on


@pytest.fixture
def own_server():
    """A TextCraft server this test may kill: {"proc", "url", "port"}; the
    current process is stopped at the end."""
    proc, url = start_server("agentenv_servers.textcraft")
    state = {"proc": proc, "url": url, "port": urlparse(url).port}
    yield state
    stop_server(state["proc"])


def crash_and_restart(state: dict) -> None:
    """SIGKILL the server and start a fresh one on the same port."""
    kill(state["proc"])
    state["proc"] = start_server_on("agentenv_servers.textcraft", state["port"])
