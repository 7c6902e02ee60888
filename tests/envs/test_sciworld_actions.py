"""SciWorld free-text actions: before stepping, the model's text maps onto a
valid action - an exact match after normalising case, spacing and "green
house" wins; otherwise the closest harmless action, never a verb the model did
not say (a wrong "focus on" fails the task). Checked on the public mapping and
against the real local ScienceWorld server, through the path the search and
eval take (``EnvSpec.prepare_action``, ``map_to_valid_action``)."""
from __future__ import annotations

import pytest

from agent_r import envs
from agentenv_client import SciworldEnvClient
from agentenv_client.sciworld import HARMLESS, closest_action

# ---- names: an exact match after normalising wins ---------------------------

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
    """Case, runs of spaces or tabs and "green house" do not stop an exact match."""
    assert closest_action(text, VALID, "") == expected


def test_the_normalised_exact_match_wins_over_word_overlap():
    """The text "focus on door to green house" is a valid action once normalised: it is
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


def test_mapping_is_deterministic_and_never_guesses_a_focus():
    """A focus on something not in view becomes a look; list order does not
    change the pick; text that fits nothing is sent as is."""
    valid = ["focus on agent", "focus on water", "go to kitchen", "look at water", "open door to kitchen"]
    assert closest_action("focus on the water please", valid, "a sink, the agent") == "look at water"
    assert closest_action("focus on the water please", valid, "a sink, water") == "focus on water"
    assert closest_action("walk to kitchen", list(reversed(valid)), "") == "go to kitchen"
    assert closest_action("dance wildly", valid, "") == "dance wildly"


# ---- verbs: never one the model did not say over a harmless one -------------

# What a model writes -> what is stepped, in the kitchen of "boil water" (task
# 0), where "examine/read thermometer" used to become ``focus on thermometer``.
# The stove is off, nothing is carried but an orange, nothing called water is
# in view, the fridge is closed.
TABLE = [
    ("examine thermometer", "look at thermometer"),
    ("read thermometer", "look at thermometer"),             # no "read thermometer": look, never focus
    ("inspect the thermometer", "look at thermometer"),
    ("check the stove", "look at stove"),
    ("look inside the fridge", "look at fridge"),            # closed: no "look in fridge"
    ("look in the sink", "look in sink"),
    ("look", "look around"),
    ("check inventory", "look at inventory"),
    ("take the thermometer", "pick up thermometer"),
    ("grab thermometer", "pick up thermometer"),
    ("turn on the stove", "activate stove"),
    ("turn off stove", "look at stove"),                     # already off: no deactivate offered
    ("open the freezer", "open freezer"),
    ("walk to the hallway", "go to hallway"),
    ("put the thermometer on the stove", "move thermometer to stove"),
    ("put down the lighter", "look at lighter"),             # not carried
    ("focus on the thermometer", "focus on thermometer"),    # said, named exactly, in view
    ("focus on water", "look around"),                       # no water in view: no focus, no raw text
    ("focus on substance in sink", "look at sink"),          # never "focus on sink"
    ("eat", "look around"),
    ("wait 1", "wait1"),
    ("boil water", "boil water"),                            # nothing fits: sent as is, the env says so
]


@pytest.fixture(scope="module")
def kitchen(sciworld_server):
    """A SciWorld client standing in the kitchen of task 0."""
    with SciworldEnvClient(sciworld_server, data_len=4639) as env:
        env.reset(0)
        env.step("open door to kitchen")
        assert env.step("go to kitchen").state == "You move to the kitchen."
        yield env


def test_table_of_phrasings_against_the_real_server(kitchen):
    """Every phrasing in the table maps to its action, each a valid one (or the
    text itself), and stepping the mapped "examine" leaves the task running."""
    valid = set(kitchen.valid_action_object_combinations())
    assert {"focus on thermometer", "look at thermometer", "mix thermometer", "reset task"} <= valid
    got = {text: kitchen.map_to_valid_action(text) for text, _ in TABLE}
    assert got == dict(TABLE)
    assert all(action in valid for text, action in got.items() if action != text)
    # and looking really is harmless: the task goes on
    out = kitchen.step(got["examine thermometer"])
    assert out.done is False and out.reward >= 0 and "thermometer" in out.state


def test_no_unnamed_irreversible_verb_for_any_phrasing_of_a_visible_object(kitchen):
    """Whatever verb-less or unknown-verb text names an object in view, the
    result is a read-only action or the text itself, never focus/eat/mix/..."""
    valid = sorted(set(kitchen.valid_action_object_combinations()))
    seen = kitchen.look_around() + "\n" + kitchen.inventory()
    for obj in ("thermometer", "stove", "sink", "lighter", "apple", "freezer", "cupboard", "soap"):
        for text in (obj, f"use the {obj} carefully", f"examine {obj}", f"study the {obj}", f"read the {obj}"):
            action = closest_action(text, valid, seen)
            if text.startswith("use"):
                assert action.startswith(("use", "look at", "look in")) or action == text
            else:
                assert action.startswith(HARMLESS) or action == text, (text, action)


def test_ties_no_longer_fall_to_the_alphabetically_first_verb():
    """Equal word overlap goes to the harmless look, unless the model said the
    verb; the word order of "put X on Y" picks which way a move goes."""
    valid = ["focus on thermometer", "look at thermometer", "mix thermometer", "pick up thermometer"]
    assert closest_action("examine thermometer", valid, "a thermometer") == "look at thermometer"
    assert closest_action("thermometer", valid, "a thermometer") == "look at thermometer"
    assert closest_action("focus thermometer", valid, "a thermometer") == "focus on thermometer"
    assert closest_action("focus on the thermometer", valid, "a stove") == "look at thermometer"   # not in view
    two = ["move apple to stove", "move stove to apple"]
    assert closest_action("put the apple on the stove", two, "") == "move apple to stove"
    assert closest_action("place stove onto apple", two, "") == "move stove to apple"
