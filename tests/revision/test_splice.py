"""The revision sample: the bad prefix (up to and including the first step
judged Bad, or the whole low path for direct revision) untrained, a revision
turn with one of our self-correction thoughts (seeded, every one reachable)
trained, then the good path from where it leaves the bad prefix trained; a
pair whose good path adds nothing after the bad prefix is dropped, and a
tree whose states are not conversations is refused."""
from __future__ import annotations

import random

import pytest

from agent_r import revision
from agent_r.revision_data import PathSettings
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend
from tests.support.revision_cases import (A, B, C, CFG, D, X, Y_ROOT, Y_SHARED, config, head, revision_turn, run,
                                          steps, thought_of)


def test_revision_thoughts_all_reachable():
    assert len(set(revision.REVISION_THOUGHTS)) >= 10
    rng = random.Random(0)
    assert {rng.choice(revision.REVISION_THOUGHTS) for _ in range(2000)} == set(revision.REVISION_THOUGHTS)


def test_verifier_calls_step_one_bad():
    backend = ScriptedBackend(tf.verifier_policy({X[0]: "Bad"}))
    res = run(tf.tree_split_at_root(), CFG, backend, idx=7)
    assert len(res.rows) == 1
    row = res.rows[0]
    assert row["revise_log"] == head() + steps(X, loss=False) + revision_turn(thought_of(row)) + steps(A, B, C, loss=True)
    assert row["high_log"] == head() + steps(A, B, C, loss=True)
    assert row["low_log"] == head() + steps(X, Y_ROOT, loss=True)
    assert row["task_num"] == "7" and row["task_description"] == tf.TASK and row["revise"] is True
    fb = row["revise_feedback"]
    assert [(f["action"], f["obs"], f["judgement"]) for f in fb] == [(X[0], X[1], "Bad")]
    assert fb[0]["revision_feedback"].endswith("Judgment: Bad")
    assert res.first_bad == {"1": 1} and res.verifier_prompts == 2  # both steps judged in the one batch
    assert backend.batch_sizes == [2]


def test_verifier_never_says_bad_whole_low_path_is_prefix():
    backend = ScriptedBackend(tf.verifier_policy({}, default="Uncertain"))
    row = run(tf.tree_split_at_root(), CFG, backend).rows[0]
    assert row["revise_log"] == (head() + steps(X, Y_ROOT, loss=False) + revision_turn(thought_of(row))
                                 + steps(A, B, C, loss=True))
    assert [f["judgement"] for f in row["revise_feedback"]] == ["Uncertain", "Uncertain"]


def test_bad_step_after_shared_prefix():
    backend = ScriptedBackend(tf.verifier_policy({X[0]: "Bad", Y_SHARED[0]: "Bad"}))
    res = run(tf.tree_shared_prefix(), CFG, backend)
    row = res.rows[0]
    # bad prefix A, X (stop after the first Bad); the good path continues from where it differs: B, C
    assert row["revise_log"] == (head() + steps(A, X, loss=False) + revision_turn(thought_of(row))
                                 + steps(B, C, loss=True))
    assert [f["judgement"] for f in row["revise_feedback"]] == ["Good", "Bad"]
    assert res.first_bad == {"2": 1}


def test_revision_inside_shared_prefix():
    """The verifier flags step A, which the good path shares: the bad prefix
    [A] is a proper prefix of the good path, so the sample continues the good
    path right after the shared part (B, C)."""
    backend = ScriptedBackend(tf.verifier_policy({A[0]: "Bad"}))
    row = run(tf.tree_shared_prefix(), CFG, backend).rows[0]
    assert row["revise_log"] == head() + steps(A, loss=False) + revision_turn(thought_of(row)) + steps(B, C, loss=True)
    assert revision.divergence_index([("a", ""), ("b", "")], [("a", "")]) == 1
    assert revision.divergence_index([("a", ""), ("b", "")], [("x", ""), ("b", "")]) == 0


def test_disaster_leaf_direct_revision():
    cfg = config(alpha=0.5, beta=0.5, revise=False)
    res = run(tf.tree_disaster(), cfg)
    assert res.pairs == 1 and res.verifier_prompts == 0
    row = res.rows[0]
    assert row["revise_log"] == head() + steps(A, D, loss=False) + revision_turn(thought_of(row)) + steps(B, C, loss=True)
    assert row["low_log"] == head() + steps(A, D, loss=True)
    assert row["revise"] is False and row["revise_feedback"] == ""


def test_good_path_with_nothing_after_bad_prefix_is_dropped():
    head_msgs = head()
    assert revision.splice(head_msgs, [("a", "o"), ("b", "o")], [("a", "o")], "t") is None


def test_thought_choice_is_seeded():
    cfg = config(alpha=0.5, beta=0.5, revise=False)
    first = [thought_of(run(tf.tree_split_at_root(), cfg, idx=i).rows[0]) for i in range(30)]
    again = [thought_of(run(tf.tree_split_at_root(), cfg, idx=i).rows[0]) for i in range(30)]
    assert first == again and len(set(first)) > 3


def test_malformed_states_raise_tree_format_error():
    root = tf.tree_split_at_root()
    root.state = root.state[:3]
    with pytest.raises(revision.TreeFormatError, match="root 'state' has 3 messages"):
        revision.plan_tree(0, root, CFG)
    root = tf.tree_split_at_root()
    root.state[2] = {"role": "user", "content": "Ok."}
    with pytest.raises(revision.TreeFormatError, match="must start with system, user, assistant, user"):
        revision.plan_tree(0, root, CFG)
    root = tf.tree_split_at_root()
    leaf = root.children[0].children[0]
    leaf.state = leaf.state[:-1]
    with pytest.raises(revision.TreeFormatError, match="does not end with an assistant turn"):
        revision.plan_tree(0, root, CFG)


def test_every_revision_thought_is_drawn():
    """The reference could only ever draw its first 10 thoughts. Drawn
    through the code that picks them (planning + rows, seeded), over enough
    pairs every one of ours appears."""
    assert len(revision.REVISION_THOUGHTS) >= 10 and len(set(revision.REVISION_THOUGHTS)) == len(
        revision.REVISION_THOUGHTS)
    cfg = PathSettings(task="textcraft", revise=False).revision_config()
    plans = [revision.plan_tree(idx, tf.tree_many_leaves(), cfg) for idx in range(60)]
    seen = set()
    for rows in revision.process_trees(plans, cfg, None):
        for row in rows.rows:
            turns = [m["content"] for m in row["revise_log"] if m["role"] == "assistant" and m.get("loss")
                     and m["content"].endswith("\nAction: wait")]
            assert len(turns) == 1
            seen.add(turns[0][len("Thought: "):-len("\nAction: wait")])
    assert seen == set(revision.REVISION_THOUGHTS)
