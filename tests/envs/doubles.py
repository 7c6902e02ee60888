"""Test doubles of the split tests: an HTTP server that answers only ``/``
and, when told, ``/identity`` (AgentGym's servers cannot say what they are),
and the few search settings the split rules read."""
from __future__ import annotations

import http.server
import json
import threading
from types import SimpleNamespace

import pytest


class _Handler(http.server.BaseHTTPRequestHandler):
    """A server that cannot say what it is, as AgentGym's cannot (404 on
    /identity), or one that answers ``identity``."""

    identity: dict | None = None

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/identity" and self.identity is not None:
            body, status = json.dumps(self.identity).encode(), 200
        elif self.path == "/":
            body, status = b'"This is environment TextCraft."', 200
        else:
            body, status = b'{"detail": "Not Found"}', 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    """start(identity=None) -> URL of a server answering only / and /identity."""
    servers = []

    def start(identity: dict | None = None) -> str:
        handler = type("Handler", (_Handler,), {"identity": identity})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def search_settings(**kw) -> SimpleNamespace:
    """The settings ``EnvSpec.search_indices`` reads, with the defaults of a plain run."""
    return SimpleNamespace(**{"split_file": None, "split": None, "min": 0, "max": None, **kw})
