"""The env clients' retry rule (SPEC section 6; architecture: "bounded
retries"): a dropped connection is retried like a 503, with backoff, and only
a bounded number of times; then the error names the server. A real TCP
front in this process drops the first K connections without answering and
passes the rest to the real TextCraft server, so the faults are real socket
faults, and the backoff sleeps are recorded instead of slept."""
from __future__ import annotations

import http.server
import json
import threading

import pytest
import requests

from agentenv_client import EnvServerError, EnvServerUnreachable, TextCraftEnvClient, WebshopEnvClient
from agentenv_client import base as client_base


class DroppingFront:
    """Accepts connections; the first ``drops`` are closed without an answer
    (the client sees a ConnectionError), later ones are forwarded to
    ``target``; ``busy`` more after those are answered 503. Counts every
    connection."""

    def __init__(self, target: str, drops: int, busy: int = 0):
        self.target, self.drops, self.busy, self.seen = target, drops, busy, 0
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"   # one request per connection: each attempt is a new one

            def log_message(self, *args):
                pass

            def handle_one_request(self):
                self.raw_requestline = self.rfile.readline(65537)
                if not self.raw_requestline or not self.parse_request():
                    return
                front.seen += 1
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if front.seen <= front.drops:
                    self.close_connection = True   # hang up: no status line at all
                    return
                if front.seen <= front.drops + front.busy:
                    self.send_response(503)
                    self.end_headers()
                    return
                res = requests.request(self.command, front.target + self.path, data=body,
                                       headers={"content-type": self.headers.get("content-type", "")}, timeout=30)
                self.send_response(res.status_code)
                self.send_header("content-type", res.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(res.content)))
                self.end_headers()
                self.wfile.write(res.content)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slept(monkeypatch):
    delays = []
    monkeypatch.setattr(client_base.time, "sleep", delays.append)
    return delays


@pytest.fixture
def front_factory(textcraft_server):
    made = []

    def make(drops: int, busy: int = 0) -> DroppingFront:
        made.append(DroppingFront(textcraft_server, drops, busy))
        return made[-1]

    yield make
    for front in made:
        front.close()


def test_dropped_connections_are_retried_until_the_server_answers(front_factory, slept):
    front = front_factory(drops=3)
    with TextCraftEnvClient(front.url, 544, max_retries=5) as client:   # /create rides out 3 drops
        assert front.seen == 4
        client.reset(1)
        assert "Goal: craft" in client.observe()
    assert slept == [0.1, 0.2, 0.4]                                      # backoff, doubling


def test_dropped_connections_are_retried_a_bounded_number_of_times(front_factory, slept):
    front = front_factory(drops=10**6)
    with pytest.raises(EnvServerUnreachable) as err:
        TextCraftEnvClient(front.url, 544, max_retries=4)
    assert front.seen == 4                                               # exactly max_retries attempts
    assert len(slept) == 3 and all(d <= client_base.BACKOFF_MAX for d in slept)
    assert front.url in str(err.value) and "4 attempt" in str(err.value)


def test_a_drop_mid_episode_is_retried_on_the_same_env(front_factory, slept, textcraft_server):
    front = front_factory(drops=0)
    client = TextCraftEnvClient(front.url, 544, max_retries=3)
    try:
        client.reset(1)
        front.drops = front.seen + 2          # the next two connections are dropped
        out = client.step("inventory")
        assert out.state.startswith("Inventory") and len(slept) == 2
    finally:
        client.close()


def test_busy_then_dropped_then_answered(front_factory, slept):
    """503 and dropped connections count against the same bound."""
    front = front_factory(drops=1, busy=2)
    with TextCraftEnvClient(front.url, 544, max_retries=4):
        assert front.seen == 4
    front2 = front_factory(drops=2, busy=2)
    with pytest.raises(EnvServerError):
        TextCraftEnvClient(front2.url, 544, max_retries=4)
    assert front2.seen == 4


# ---- what each client sends and how it reads answers (SPEC section 6) -------

class CannedServer:
    """Answers each path with a fixed JSON value (a dict of path -> value,
    changeable between requests) and records every request as (method, path,
    query, JSON body)."""

    def __init__(self, answers: dict):
        self.answers, self.seen = answers, []
        canned = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                path, _, query = self.path.partition("?")
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                canned.seen.append((self.command, path, query, json.loads(raw) if raw else None))
                if path not in canned.answers:
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(canned.answers[path]).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def canned():
    made = []

    def make(answers):
        made.append(CannedServer(answers))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_webshop_protocol(canned):
    server = canned({"/create": 7, "/reset": {"ok": True}, "/observation": "WebShop [SEP] find a scarf",
                     "/step": {"state": "page", "reward": 0.5, "done": True, "info": {"asin": "B02"}}, "/close": True})
    client = WebshopEnvClient(server.url, 3)
    assert client.env_id == 7 and server.seen[0] == ("POST", "/create", "", None)   # no body, as AgentGym's
    client.reset(2)
    assert server.seen[1] == ("POST", "/reset", "", {"session_id": 2, "env_idx": 7})
    assert client.info == {"observation": "WebShop [SEP] find a scarf", "reward": 0, "done": False}
    out = client.step("  click[Buy Now] ")
    assert server.seen[-1] == ("POST", "/step", "", {"action": "click[Buy Now]", "env_idx": 7})
    assert (out.state, out.reward, out.done) == ("page", 0.5, True)
    assert client.info == {"observation": "page", "reward": 0.5, "done": True, "info": {"asin": "B02"}}
    client.close()
    assert server.seen[-1] == ("POST", "/close", "", {"env_idx": 7})


def test_textcraft_protocol(canned):
    server = canned({"/create": {"id": 3, "observation": "start", "done": False, "reward": 0},
                     "/reset": {"id": 3, "observation": "Goal: craft stick.", "done": False, "reward": 0},
                     "/step": {"observation": "Got 1 stick", "reward": 1, "done": True}, "/close": True})
    with TextCraftEnvClient(server.url, 544) as client:
        assert server.seen[0] == ("POST", "/create", "", {"commands": None, "goal": None})
        client.reset(5)
        assert server.seen[1][3] == {"data_idx": 5, "id": 3} and client.observe() == "Goal: craft stick."
        out = client.step("get  1 stick!\n")
        assert server.seen[2][3] == {"action": "get 1 stick", "id": 3}                # cleaned to [A-Za-z0-9, ]
        assert (out.state, out.reward, out.done) == ("Got 1 stick", 1.0, True)
        assert client.info == {"observation": "Got 1 stick", "reward": 1.0, "done": True}


@pytest.mark.parametrize("cls,answers,call,endpoint,key", [
    (TextCraftEnvClient, {"/create": {"observation": "x"}}, None, "create", "id"),
    (TextCraftEnvClient, {"/create": {"id": 1}}, None, "create", "observation"),
    (TextCraftEnvClient, {"/step": {"observation": "x", "reward": 0}}, "step", "step", "done"),
    (TextCraftEnvClient, {"/step": {"reward": 0, "done": False}}, "step", "step", "observation"),
    (TextCraftEnvClient, {"/step": {"observation": "x", "done": False}}, "step", "step", "reward"),
    (TextCraftEnvClient, {"/reset": {"id": 1}}, "reset", "reset", "observation"),
    (WebshopEnvClient, {"/step": {"reward": 0, "done": False}}, "step", "step", "state"),
    (WebshopEnvClient, {"/step": {"state": "s", "done": False}}, "step", "step", "reward"),
    (WebshopEnvClient, {"/step": {"state": "s", "reward": 0}}, "step", "step", "done"),
])
def test_an_answer_lacking_a_field_names_endpoint_and_field(canned, cls, answers, call, endpoint, key):
    base = {"/create": 1 if cls is WebshopEnvClient else {"id": 1, "observation": "o"}, "/close": True,
            "/reset": {"id": 1, "observation": "o"}}
    server = canned({**base, **answers})
    with pytest.raises(EnvServerError) as err:
        client = cls(server.url, 3)
        if call == "step":
            client.step("inventory")
        elif call == "reset":
            client.reset(0)
    assert f"/{endpoint}" in str(err.value) and f"lacks {key!r}" in str(err.value) and server.url in str(err.value)
    assert err.value.endpoint == endpoint


def test_webshop_create_must_answer_an_integer_id(canned):
    for bad in ("7", True, {"id": 7}):
        server = canned({"/create": bad})
        with pytest.raises(EnvServerError, match=r"/create.*expected an integer env id"):
            WebshopEnvClient(server.url, 3)
    server = canned({"/create": 1, "/observation": {"text": "x"}, "/reset": {}})
    with pytest.raises(EnvServerError, match=r"/observation.*expected a string"):
        WebshopEnvClient(server.url, 3).reset(0)


@pytest.mark.parametrize("cls", [TextCraftEnvClient, WebshopEnvClient])
def test_close_on_a_dead_server_tries_once(cls, canned, slept):
    """Closing is best effort: one attempt, however many retries other calls get."""
    server = canned({"/create": 4 if cls is WebshopEnvClient else {"id": 4, "observation": "o"}, "/close": True})
    client = cls(server.url, 3, max_retries=5)
    server.close()
    client.close()                       # the server is gone: logged, not raised
    assert slept == []                   # no retry, no backoff
    client.close()                       # idempotent
