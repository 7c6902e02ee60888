"""The env clients' retry rule: a dropped connection is retried like a 503,
with doubling backoff, a bounded number of times; then the error names the
server. Closing is best effort: one attempt. A real TCP front in this process
drops the first K connections without answering and passes the rest to the
real TextCraft server, so the faults are real socket faults, and the backoff
sleeps are recorded instead of slept."""
from __future__ import annotations

import pytest
import requests

from agentenv_client import EnvServerError, EnvServerUnreachable, TextCraftEnvClient, WebshopEnvClient
from agentenv_client import base as client_base


def test_dropped_connections_are_retried_until_the_server_answers(front_factory, slept):
    """Three dropped connections, then an answer: the client gets through with
    doubling backoff (0.1, 0.2, 0.4 s)."""
    front = front_factory(drops=3)
    with TextCraftEnvClient(front.url, 544, max_retries=5) as client:   # /create rides out 3 drops
        assert front.seen == 4
        client.reset(1)
        assert "Goal: craft" in client.observe()
    assert slept == [0.1, 0.2, 0.4]                                      # backoff, doubling


def test_dropped_connections_are_retried_a_bounded_number_of_times(front_factory, slept):
    """A server that never answers gets exactly max_retries attempts, backoff
    capped; the error names the URL and the attempt count."""
    front = front_factory(drops=10**6)
    with pytest.raises(EnvServerUnreachable) as err:
        TextCraftEnvClient(front.url, 544, max_retries=4)
    assert front.seen == 4                                               # exactly max_retries attempts
    assert len(slept) == 3 and all(d <= client_base.BACKOFF_MAX for d in slept)
    assert front.url in str(err.value) and "4 attempt" in str(err.value)


def test_a_drop_mid_episode_is_retried_on_the_same_env(front_factory, slept, textcraft_server):
    """Two drops during a step: the step is retried on the same env and succeeds."""
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


def test_busy_server_is_retried_then_reported(webshop_double):
    """503 answers are retried; past max_retries the error says the server was busy and how often it was tried."""
    with WebshopEnvClient(webshop_double, 3, max_retries=4) as env:
        env.reset(0)
        requests.post(f"{webshop_double}/_busy", json={"n": 2})
        assert env.step("search[shirt]").done is False       # 503, 503, then OK
        assert requests.get(f"{webshop_double}/health").json()["busy_left"] == 0
        requests.post(f"{webshop_double}/_busy", json={"n": 50})
        with pytest.raises(EnvServerError, match=r"busy \(HTTP 503\) after 2 tries"):
            WebshopEnvClient(webshop_double, 3, max_retries=2).step("search[shirt]")
        requests.post(f"{webshop_double}/_busy", json={"n": 0})


@pytest.mark.parametrize("cls", [TextCraftEnvClient, WebshopEnvClient])
def test_close_on_a_dead_server_tries_once(cls, canned, slept):
    """Closing is best effort: one attempt, however many retries other calls get."""
    server = canned({"/create": 4 if cls is WebshopEnvClient else {"id": 4, "observation": "o"}, "/close": True})
    client = cls(server.url, 3, max_retries=5)
    server.close()
    client.close()                       # the server is gone: logged, not raised
    assert slept == []                   # no retry, no backoff
    client.close()                       # idempotent
