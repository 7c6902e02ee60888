"""Batched replay on the real ScienceWorld server (one JVM; kept small): the
replayed env answers the action mapping and the next step as the env stepped
one action at a time does.

ScienceWorld lists a room's contents in another order on every load of the
same game (step by step too: "a wood cup (containing red paint)" first on one
load, "... yellow paint" on the next), so observations are compared as bags of
words."""
from __future__ import annotations

from collections import Counter

from agent_r import envs

SCIWORLD = envs.get_env("sciworld")
IDX = 1                                    # boil, variation 1
ACTIONS = ["look around", "inventory", "go to hallway"]
FREE_TEXT = "open the door to the hallway"


def words(text: str) -> Counter:
    return Counter(text.replace(",", " ").split())


def test_sciworld_replay_matches_steps(sciworld_server):
    with SCIWORLD.make_client(sciworld_server) as client:
        client.use_replay = False
        client.reset(IDX)
        for action in ACTIONS:
            client.step(action)
        mapped = SCIWORLD.prepare_action(client, FREE_TEXT)
        opened = client.step(mapped)
        looked = client.step("look around")
        assert mapped.startswith("open door") and client.replay_requests == 0

        client.use_replay = True
        client.replay(IDX, ACTIONS)
        # the mapping's first request sends the pending replay: the env is where the steps left it
        assert SCIWORLD.prepare_action(client, FREE_TEXT) == mapped and client.replay_requests == 1
        again = client.step(mapped)
        assert (words(again.state), again.reward, again.done) == (words(opened.state), opened.reward, opened.done)

        client.replay(0, [])                   # another game first: the look-around text must come from the replay
        client.observe()
        client.replay(IDX, ACTIONS + [mapped])
        sent = client.http_requests
        out = client.step("look around")       # the replay and this step: one request
        assert client.http_requests - sent == 1 and client.replay_requests == 2
        assert words(out.state) == words(looked.state) and (out.reward, out.done) == (looked.reward, looked.done)
        assert client._last_look == out.state and client.info["score"] == looked.reward
