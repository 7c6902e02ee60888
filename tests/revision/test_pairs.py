"""Which leaf paths become pairs: a tree without a successful leaf is
skipped; every ordered (high, low) pair whose high path scores above ALPHA
and whose gap exceeds BETA (both strict, each on its own comparison, with
every environment's defaults) is kept, shuffled with a seeded generator and
cut only by --max_pairs_per_tree; good-only data takes each distinct path
above ALPHA once."""
from __future__ import annotations

import json
import random

import pytest

from agent_r import envs, revision
from agent_r.revision_data import PathSettings, collect
from agent_r.settings import parse
from tests.support import tree_fixtures as tf
from tests.support.faults import run_script
from tests.support.revision_cases import (A, B, C, CFG, config, direct_config, gap_of_exactly, head, run, score_pairs,
                                          steps)


def test_no_successful_leaf_is_skipped():
    assert run(tf.tree_no_success(), CFG) is None


def test_one_leaf_gives_no_pair_but_one_good_sample():
    assert run(tf.tree_one_leaf(), CFG).rows == []
    res = run(tf.tree_one_leaf(), config(alpha=0.5, beta=0.5, data_type="good"))
    assert res.rows == [{"task_num": "0", "revise_log": head() + steps(A, B, C, loss=True), "revise": False}]


def test_pair_gap_must_exceed_beta():
    cfg = config(alpha=0.5, beta=0.5, revise=False)
    assert run(tf.tree_scored([1.0, 0.6]), cfg).pairs == 0       # gap 0.4
    assert run(tf.tree_scored([1.0, 0.5]), cfg).pairs == 0       # gap 0.5 is not > 0.5
    assert run(tf.tree_scored([1.0, 0.4]), cfg).pairs == 1


def test_high_leaf_must_exceed_alpha():
    cfg = config(alpha=0.5, beta=0.3, revise=False)
    res = run(tf.tree_scored([0.4, 0.0]), cfg)                    # root value 0.4 > 0: read, not skipped
    assert res is not None and res.pairs == 0 and not res.skipped
    good = run(tf.tree_scored([0.4, 0.0]), config(alpha=0.5, beta=0.3, data_type="good"))
    assert good.rows == []


def test_pairs_sorted_shuffled_and_capped():
    # scores 0.9, 0.1, 1.0, 0.0 -> highs 1.0 and 0.9, lows 0.1 and 0.0: 4 pairs
    root = tf.tree_scored([0.9, 0.1, 1.0, 0.0])
    paths = revision.sorted_leaf_paths(root)
    assert [revision.path_score(p) for p in paths] == [1.0, 0.9, 0.1, 0.0]
    cfg = config(alpha=0.5, beta=0.5, revise=False, max_pairs_per_tree=0)
    pairs = revision.select_pairs(paths, cfg, random.Random(1))
    got = sorted((revision.path_score(h), revision.path_score(l)) for h, l in pairs)
    assert got == [(0.9, 0.0), (0.9, 0.1), (1.0, 0.0), (1.0, 0.1)]
    capped = revision.select_pairs(paths, config(alpha=0.5, beta=0.5, max_pairs_per_tree=3), random.Random(1))
    assert len(capped) == 3
    # the seed changes the order (and so which pairs survive the cap)
    orders = {tuple((revision.path_score(h), revision.path_score(l)) for h, l in
                    revision.select_pairs(paths, cfg, random.Random(s))) for s in range(20)}
    assert len(orders) > 1


def test_good_paths_deduplicated():
    root = tf.make_root()
    for _ in range(2):  # the same turns twice (e.g. two identical runs of the same leaf)
        tf.add_step(root, "get 4 stick", "Got 4 stick", score=1)
    tf.backup(root)
    res = run(root, config(alpha=0.5, beta=0.5, data_type="good"))
    assert len(res.rows) == 1 and res.good_samples == 1


def test_alpha_bounds_the_high_path_and_beta_the_gap_each_strictly():
    """ALPHA 0.5 and BETA 0.25 (different, so swapping them shows): a pair
    needs high > ALPHA (0.5 itself is not enough, even with a gap of 0.5) and
    a gap > BETA (a gap of exactly 0.25 is not enough)."""
    root = tf.tree_scored([1.0, 0.75, 0.5, 0.25, 0.0])
    pairs = score_pairs(root, direct_config(alpha=0.5, beta=0.25))
    assert pairs == {(1.0, 0.5), (1.0, 0.25), (1.0, 0.0), (0.75, 0.25), (0.75, 0.0)}
    # the thresholds swapped would give another set: each is applied to its own comparison
    assert score_pairs(root, direct_config(alpha=0.25, beta=0.5)) == {(1.0, 0.25), (1.0, 0.0), (0.75, 0.0)}
    good = revision.plan_tree(1, root, direct_config(alpha=0.5, beta=0.25, data_type="good"))
    assert [revision.path_score(p) for p in good.goods] == [1.0, 0.75]   # > ALPHA, best first


@pytest.mark.parametrize("task", ["textcraft", "sciworld", "webshop"])
def test_each_environment_default_thresholds_are_strict(task):
    """Unset ALPHA/BETA take the environment's defaults (agent_r/envs), and
    those are strict bounds too, on that environment's score scale."""
    spec = envs.get_env(task)
    settings = parse(PathSettings, [], {"TASK": task})
    assert (settings.alpha, settings.beta) == (spec.alpha, spec.beta)
    alpha, beta = spec.alpha, spec.beta
    eps = spec.max_score / 64
    high = alpha + eps                             # clears ALPHA
    at_alpha = alpha                               # does not
    at_beta = gap_of_exactly(high, beta)           # gap exactly BETA: not a pair
    below = high - beta - eps                      # gap above BETA: a pair
    assert high - below > beta and below >= 0
    root = tf.tree_scored([high, at_alpha, at_beta, below])
    pairs = score_pairs(root, parse(PathSettings, ["--revise", "0"], {"TASK": task}).revision_config())
    expected = {(high, low) for low in (at_alpha, at_beta, below) if high - low > beta}
    assert pairs == expected and (high, below) in pairs and (high, at_beta) not in pairs
    assert all(h != at_alpha for h, _ in pairs)


def test_cli_reads_alpha_and_beta_from_the_environment(tmp_path):
    """path_collection.py with ALPHA=0.5 BETA=0.25: the rows are exactly the
    pairs above (leaf i scores the i-th value; its action names i)."""
    scores = [1.0, 0.75, 0.5, 0.25, 0.0]
    tf.write_tree(tf.tree_scored(scores), tmp_path / "trees", 3)
    res = run_script("path_collection.py", "--input_dir", tmp_path / "trees", "--output_dir", tmp_path / "out",
                     "--revise", "0", env={"TASK": "textcraft", "ALPHA": "0.5", "BETA": "0.25"})
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "textcraft_centric.jsonl").read_text().splitlines()]

    def score(log):
        action = log[4]["content"].rsplit("Action: ", 1)[1]
        return scores[int(action.split()[1]) - 1]   # "get {i+1} oak log"

    assert {(score(r["high_log"]), score(r["low_log"])) for r in rows} == \
        {(1.0, 0.5), (1.0, 0.25), (1.0, 0.0), (0.75, 0.25), (0.75, 0.0)}
    assert len(rows) == 5


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
