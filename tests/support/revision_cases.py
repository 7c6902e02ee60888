"""Revision data on hand-built trees (tests/support/tree_fixtures.py): the
steps of those trees, the messages a row must hold, and the settings the
scripts build (``config``: as path_collection.py builds them; ``direct_config``:
the same with revise off by default). ``run`` plans and processes one tree
with a verifier double; ``verify`` judges the low path of ``verifier_tree``."""
from __future__ import annotations

import json
import math
from pathlib import Path

from agent_r import revision
from agent_r.conversation import clean_observation
from agent_r.revision_data import PathSettings
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend


A = ("get 1 oak log", "Got 1 oak log")
B = ("craft 4 oak planks using 1 oak log", "Crafted 4 minecraft:oak_planks")
C = ("craft 4 stick using 2 oak planks", "Crafted 4 minecraft:stick")
X = ("get 1 diamond", "Could not find diamond")
Y_ROOT = ("inventory", "Inventory: ")
Y_SHARED = ("inventory", "Inventory: [oak log] (1)")
D = ("craft 1 tnt using 1 oak log", "The task failed.")


def head():
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": tf.INSTRUCTION},
        {"role": "assistant", "content": "Ok.", "loss": False},
        {"role": "user", "content": tf.TASK},
    ]


def steps(*pairs, loss):
    out = []
    for action, obs in pairs:
        out += [{"role": "assistant", "content": tf.turn_text(action), "loss": loss},
                {"role": "user", "content": clean_observation(obs)}]
    return out


def revision_turn(thought):
    assert thought in revision.REVISION_THOUGHTS
    return [{"role": "assistant", "content": f"Thought: {thought}\nAction: wait", "loss": True},
            {"role": "user", "content": "ok."}]


def run(root, cfg, backend=None, idx=0):
    plan = revision.plan_tree(idx, root, cfg)
    if plan is None:
        return None
    return revision.process_trees([plan], cfg, backend)[0]


def thought_of(row):
    msg = [m for m in row["revise_log"] if m["content"].endswith("\nAction: wait")]
    assert len(msg) == 1
    return msg[0]["content"][len("Thought: "):-len("\nAction: wait")]


def config(**kw):
    """A RevisionConfig built the one way the scripts build it."""
    return PathSettings(task="textcraft", **kw).revision_config()


CFG = config(alpha=0.5, beta=0.5)


def direct_config(task: str = "textcraft", **overrides) -> revision.RevisionConfig:
    """The RevisionConfig path_collection.py builds, from PathSettings."""
    return PathSettings(task=task, revise=False, **overrides).revision_config()


def score_pairs(root, cfg) -> set[tuple[float, float]]:
    """(high score, low score) of every pair the plan holds."""
    plan = revision.plan_tree(1, root, cfg)
    return {(revision.path_score(h), revision.path_score(low)) for h, low in plan.pairs}


def gap_of_exactly(high: float, beta: float) -> float:
    """A score ``low`` with ``high - low == beta`` in floating point, so the
    boundary case is really on the boundary."""
    low = high - beta
    for candidate in (low, math.nextafter(low, math.inf), math.nextafter(low, -math.inf)):
        if high - candidate == beta:
            return candidate
    raise AssertionError(f"no float gap of exactly {beta} below {high}")


def verifier_tree():
    """Good path G (score 1); low path L1-L2-L3 (score 0). Every action,
    observation and the task are distinct tokens, so a prompt's content shows
    exactly which of them it carries."""
    root = tf.make_root(task="TASK-TOKEN: craft the thing.")
    tf.add_step(root, "act-good", "obs-good", score=1)
    l1 = tf.add_step(root, "act-one", "obs-one")
    l2 = tf.add_step(l1, "act-two", "obs-two")
    tf.add_step(l2, "act-three", "obs-three", score=0)
    return tf.backup(root)


def verify(policy, **settings):
    """Plan the verifier tree, judge its low path with ``policy``; (rows, backend)."""
    cfg = PathSettings(task="textcraft", revise=True, alpha=0.5, beta=0.5, **settings).revision_config()
    backend = ScriptedBackend(policy)
    (rows,) = revision.process_trees([revision.plan_tree(1, verifier_tree(), cfg)], cfg, backend)
    return rows, backend


def rows_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
