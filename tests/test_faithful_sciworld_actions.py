"""SciWorld free-text actions (issue 16, item 1): the mapping onto valid
actions never picks a verb the model did not say over a harmless one. The
table runs against the real ScienceWorld server: in the kitchen of "boil
water" (task 0), where "examine/read thermometer" used to become
``focus on thermometer`` (a wrong focus fails the task)."""
from __future__ import annotations

import pytest

from agentenv_client import SciworldEnvClient
from agentenv_client.sciworld import HARMLESS, closest_action

# what a model writes -> what is stepped (kitchen of task 0; the stove is off, nothing is carried
# but an orange, nothing called water is in view, the fridge is closed)
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
    with SciworldEnvClient(sciworld_server, data_len=4639) as env:
        env.reset(0)
        env.step("open door to kitchen")
        assert env.step("go to kitchen").state == "You move to the kitchen."
        yield env


def test_table_of_phrasings_against_the_real_server(kitchen):
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
    valid = ["focus on thermometer", "look at thermometer", "mix thermometer", "pick up thermometer"]
    assert closest_action("examine thermometer", valid, "a thermometer") == "look at thermometer"
    assert closest_action("thermometer", valid, "a thermometer") == "look at thermometer"
    assert closest_action("focus thermometer", valid, "a thermometer") == "focus on thermometer"
    assert closest_action("focus on the thermometer", valid, "a stove") == "look at thermometer"   # not in view
    two = ["move apple to stove", "move stove to apple"]
    assert closest_action("put the apple on the stove", two, "") == "move apple to stove"
    assert closest_action("place stove onto apple", two, "") == "move stove to apple"
