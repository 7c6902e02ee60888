"""Fixtures of the revision tests: ``trees``, a folder of tree files written
from the hand-built fixtures as mcts_collection.py lays them out."""
import json

import pytest

from tests.support import tree_fixtures as tf


@pytest.fixture
def trees(tmp_path):
    d = tmp_path / "mcts_result" / "textcraft" / "m"
    tf.write_tree(tf.tree_split_at_root(), d, 3)
    tf.write_tree(tf.tree_shared_prefix(), d, 12)
    tf.write_tree(tf.tree_no_success(), d, 5)
    tf.write_tree(tf.tree_disaster(), d, 1000)   # indices >= 1000 are reached too
    tf.write_tree(tf.tree_many_leaves(), d, 40)
    (d / "manifest.json").write_text(json.dumps({"config": {"ITERA": 8}}))  # not a tree: ignored
    return d
