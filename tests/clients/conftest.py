"""Fixtures of the client tests: recorded backoff sleeps, fronts that drop
connections, canned-answer servers, and the WebShop server double."""
from __future__ import annotations

import pytest

from agentenv_client import base as client_base
from tests.clients.fake_servers import CannedServer, DroppingFront
from tests.support.env_fixtures import start_server, stop_server


@pytest.fixture
def slept(monkeypatch):
    """The client's backoff delays, recorded instead of slept."""
    delays = []
    monkeypatch.setattr(client_base.time, "sleep", delays.append)
    return delays


@pytest.fixture
def front_factory(textcraft_server):
    """make(drops, busy=0) -> a DroppingFront before the shared TextCraft server."""
    made = []

    def make(drops: int, busy: int = 0) -> DroppingFront:
        made.append(DroppingFront(textcraft_server, drops, busy))
        return made[-1]

    yield make
    for front in made:
        front.close()


@pytest.fixture
def canned():
    """make(answers) -> a CannedServer; all are closed at the end."""
    made = []

    def make(answers):
        made.append(CannedServer(answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(scope="module")
def webshop_double():
    """URL of the WebShop server double (tests/support/webshop_double.py), one per module."""
    proc, url = start_server("tests.support.webshop_double")
    yield url
    stop_server(proc)
