"""What each client sends and how it reads the answers: the request bodies of
WebShop's and TextCraft's protocols, action cleaning, the ``info`` after each
call, and answers lacking a field. A server of canned answers in this process
records every request."""
from __future__ import annotations

import pytest

from agentenv_client import EnvServerError, TextCraftEnvClient, WebshopEnvClient
from agentenv_client.textcraft import clean_action


def test_webshop_protocol(canned):
    """WebShop: /create without a body answers a bare id; reset, step and close
    send env_idx; the step's action is stripped; info holds the last answer."""
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
    """TextCraft: /create sends commands and goal (null), reset and step send the
    id; the action is cleaned; info holds observation, reward and done."""
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
    """An answer without a field the client needs is an error naming the endpoint, the field and the URL."""
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
    """WebShop's /create must answer an integer id and /observation a string; anything else is named."""
    for bad in ("7", True, {"id": 7}):
        server = canned({"/create": bad})
        with pytest.raises(EnvServerError, match=r"/create.*expected an integer env id"):
            WebshopEnvClient(server.url, 3)
    server = canned({"/create": 1, "/observation": {"text": "x"}, "/reset": {}})
    with pytest.raises(EnvServerError, match=r"/observation.*expected a string"):
        WebshopEnvClient(server.url, 3).reset(0)


def test_client_cleans_actions_like_agentgym():
    """TextCraft actions keep only letters, digits, commas and single spaces, as AgentGym's client sends them."""
    assert clean_action("  craft 4 oak-planks\nusing 1 oak logs.  ") == "craft 4 oakplanks using 1 oak logs"
    assert clean_action("get 1 lapis_lazuli!") == "get 1 lapislazuli"


def test_textcraft_client_info_after_reset(textcraft_server):
    """The AgentGym client's ``info`` after a reset: the task's observation, no reward yet, not done."""
    client = TextCraftEnvClient(textcraft_server, 3)
    try:
        client.reset(1)
        assert set(client.info) >= {"observation", "reward", "done"}
        assert client.info["observation"].startswith("Crafting commands:")
        assert client.info["reward"] == 0 and client.info["done"] is False
    finally:
        client.close()
