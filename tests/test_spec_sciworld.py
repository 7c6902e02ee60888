"""SciWorld name normalisations (SPEC section 6: before stepping, a free-text
action maps onto a valid one, an exact match after normalising case, spacing
and "green house" winning), against the public mapping and the real local
ScienceWorld server, through the same path the search and eval take
(EnvSpec.prepare_action)."""
from __future__ import annotations

import pytest

from agent_r import envs
from agentenv_client.sciworld import closest_action

VALID = ["go to hallway", "look around", "look at greenhouse", "open door to greenhouse", "open door to kitchen",
         "focus on door to greenhouse"]


@pytest.mark.parametrize("text,expected", [
    ("open door to greenhouse", "open door to greenhouse"),
    ("open door to green house", "open door to greenhouse"),
    ("Open Door To Green House", "open door to greenhouse"),
    ("  open   door to\tgreen   house ", "open door to greenhouse"),
    ("OPEN DOOR TO GREEN HOUSE", "open door to greenhouse"),
    ("Look Around", "look around"),
])
def test_exact_match_after_normalising(text, expected):
    assert closest_action(text, VALID, "") == expected


def test_the_normalised_exact_match_wins_over_word_overlap():
    """"focus on door to green house" is a valid action once normalised: it is
    taken as is, though a harmless action shares words with it too."""
    assert closest_action("Focus on door to Green House", VALID, "door to greenhouse") == \
        "focus on door to greenhouse"


def test_on_the_real_server_the_normalised_action_is_stepped(sciworld_server):
    """Game 0 (boil water) starts in the hallway with a closed door to the
    greenhouse: the model's spelling opens it, and then walks through."""
    spec = envs.get_env("sciworld")
    with spec.make_client(sciworld_server) as client:
        client.reset(0)
        assert "door to the greenhouse" in client.observe()
        opened = spec.prepare_action(client, "OPEN the door to the Green House")
        assert opened == "open door to greenhouse"
        assert "open" in client.step(opened).state.lower()
        walk = spec.prepare_action(client, "go to green house")
        assert walk == "go to greenhouse"
        assert "greenhouse" in client.step(walk).state
