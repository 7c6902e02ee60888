"""The cap on revision pairs per tree (--max_pairs_per_tree): 1 keeps exactly
one pair, 0 keeps them all."""
from __future__ import annotations

import random

from agent_r import revision
from agent_r.revision_data import PathSettings
from tests.support.tree_fixtures import add_step, backup, make_root


def test_one_pair_per_tree_keeps_exactly_one():
    """With max_pairs_per_tree=1 one pair of the 9 is kept; 0 keeps every pair."""
    root = make_root()
    for k in range(3):
        add_step(root, f"get {k + 1} oak log", "Got it", score=1.0)
        add_step(root, f"craft {k} stick", "Could not craft", score=0.0)
    paths = [[leaf] for leaf in backup(root).children]
    cfg = PathSettings(task="textcraft", max_pairs_per_tree=1).revision_config()
    assert len(revision.select_pairs(paths, cfg, random.Random(0))) == 1
    every = PathSettings(task="textcraft", max_pairs_per_tree=0).revision_config()
    assert len(revision.select_pairs(paths, every, random.Random(0))) == 9
