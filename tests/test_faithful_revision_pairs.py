"""Revision pair count (issue 16, item 2): with default flags every ordered
(high, low) leaf pair clearing ALPHA and BETA becomes a row, as in the
reference; ``--max_pairs_per_tree`` still caps them when given."""
from __future__ import annotations

import json

from agent_r.revision_data import PathSettings, collect
from agent_r.settings import parse
from tests.support import tree_fixtures as tf


def tree_4_good_6_low():
    """Four good leaves (score 1) and six failed ones (score 0), all one step
    from the root: 4 x 6 = 24 pairs with TextCraft's ALPHA 0.5 / BETA 0.5."""
    return tf.tree_scored([1, 0, 1, 0, 0, 1, 0, 0, 1, 0])


def test_default_flags_keep_every_pair(tmp_path):
    trees = tmp_path / "trees"
    trees.mkdir()
    tf.write_tree(tree_4_good_6_low(), trees, 3)
    tf.write_tree(tf.tree_many_leaves(), trees, 5)            # 2 good x 4 low = 8 pairs
    settings = parse(PathSettings, ["--input_dir", str(trees), "--output_dir", str(tmp_path / "out"),
                                    "--revise", "0"], {"TASK": "textcraft"})
    assert settings.max_pairs_per_tree == 0
    result = collect(settings)
    rows = [json.loads(line) for line in result.output.read_text().splitlines()]
    assert len(rows) == 24 + 8 == result.rows
    assert sum(r["task_num"] == "3" for r in rows) == 24
    assert "pairs: 32 " in result.report()


def test_the_cap_is_still_a_flag(tmp_path):
    trees = tmp_path / "trees"
    trees.mkdir()
    tf.write_tree(tree_4_good_6_low(), trees, 3)
    settings = parse(PathSettings, ["--input_dir", str(trees), "--output_dir", str(tmp_path / "out"),
                                    "--revise", "0", "--max_pairs_per_tree", "8"], {"TASK": "textcraft"})
    assert collect(settings).rows == 8
