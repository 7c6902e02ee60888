"""Pair selection, verifier parsing/batching and splicing on hand-built trees.

The verifier is ``ScriptedBackend`` (a test double: no real model can give a
chosen judgement per step); everything else is the real code.
"""
import random

import pytest

from agent_r import revision, verifier
from agent_r.verifier import parse_judgement
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
                {"role": "user", "content": obs}]
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


# ------------------------------------------------------------------ parsing

@pytest.mark.parametrize("reply,label", [
    ("Looks fine.\nJudgment: Good", "Good"),
    ("Judgement: BAD.", "Bad"),
    ("**Judgment:** **uncertain**", "Uncertain"),
    ("Judgment: Good\nOn second thought...\nJudgment: Bad", "Bad"),
    ("Judgment: not good", None),            # the reference's substring test called this Good
    ("This step is bad, not good.", None),   # no marker
    ("Judgment: Goodness knows", None),
    ("Judgment: <Good|Bad|Uncertain>", None),   # the instruction echoed back
    ("Judgment: Good, Bad or Uncertain", None),
    ("Judgment: good or bad", None),
    ("Judgment: [Bad]", "Bad"),
    ("Judgment: Good, because the log is needed.", "Good"),
    ("", None),
])
def test_parse_judgement_reads_only_the_last_marker(reply, label):
    assert parse_judgement(reply) == label


def test_unparseable_counts_and_acts_as_uncertain():
    v = verifier.make_verdict(["Good", None, "Bad", None], ["a", "b", "c", "d"])
    assert v.labels == ["Good", "Uncertain", "Bad", "Uncertain"]
    assert (v.unparseable, v.cut, v.first_bad) == (2, 3, 3)
    v = verifier.make_verdict([None, None], ["a", "b"])
    assert (v.cut, v.first_bad) == (2, None)


def test_revision_thoughts_all_reachable():
    assert len(set(revision.REVISION_THOUGHTS)) >= 10
    rng = random.Random(0)
    assert {rng.choice(revision.REVISION_THOUGHTS) for _ in range(2000)} == set(revision.REVISION_THOUGHTS)


# ------------------------------------------------------------------ selection

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


# ------------------------------------------------------------------ splicing

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


# ------------------------------------------------------------------ verifier batching

def test_each_distinct_low_path_verified_once_in_one_call():
    backend = ScriptedBackend(tf.verifier_policy({}))
    cfg = config(alpha=0.5, beta=0.5, max_pairs_per_tree=0)
    root = tf.tree_many_leaves()
    res = run(root, cfg, backend)
    assert res.pairs == 8 and len(res.rows) == 8
    lows = {tuple(m["content"] for m in r["low_log"]) for r in res.rows}
    assert len(lows) == 4
    # one generate call; 7 steps over 4 distinct low paths, step A shared -> 6 prompts
    assert backend.batch_sizes == [6] and res.verifier_prompts == 6
    assert res.verifier_prompts <= 4 * 2
    prompts = [repr(r.messages) for r in backend.batches[0].requests]
    assert len(set(prompts)) == len(prompts)
    judged = sorted(tf.judged_step(r.messages) for r in backend.batches[0].requests)
    assert judged == [(1, "get 1 dirt"), (1, "get 1 oak log"), (1, "inventory"),
                      (2, "get 1 diamond"), (2, "get 1 gold"), (2, "get 2 dirt")]


def test_many_trees_share_one_batched_call():
    backend = ScriptedBackend(tf.verifier_policy({X[0]: "Bad"}))
    plans = [revision.plan_tree(i, tf.tree_split_at_root(f"{tf.TASK} ({i})"), CFG) for i in range(5)]
    results = revision.process_trees(plans, CFG, backend)
    assert len(backend.batches) == 1 and backend.batch_sizes == [10]
    assert [r.verifier_prompts for r in results] == [2] * 5
    assert all(r.rows[0]["revise_log"][4]["loss"] is False for r in results)
    # two trees of the same task with the same steps: identical prompts are sent once
    backend = ScriptedBackend(tf.verifier_policy({X[0]: "Bad"}))
    plans = [revision.plan_tree(i, tf.tree_split_at_root(), CFG) for i in range(2)]
    results = revision.process_trees(plans, CFG, backend)
    assert backend.batch_sizes == [2] and [r.verifier_prompts for r in results] == [2, 0]
    assert results[0].rows[0]["revise_feedback"] == results[1].rows[0]["revise_feedback"]


def test_verifier_prompt_layout_and_history_truncation():
    backend = ScriptedBackend(tf.verifier_policy({}))
    root = tf.tree_shared_prefix()
    low = [p for p in revision.sorted_leaf_paths(root) if revision.path_score(p) == 0][0]
    cfg = config(alpha=0.5, beta=0.5)
    verifier.verify_paths(backend, cfg, [(tf.TASK, low, 0)])
    last = backend.batches[0].requests[-1].messages[-1]["content"]
    assert tf.TASK in last and "Step 1 action: get 1 oak log" in last and "(step 3):\nAction: inventory" in last
    assert last.rstrip().splitlines()[-1].startswith("Judgment:")
    # a tiny budget drops the oldest history steps but keeps the step itself
    small = config(alpha=0.5, beta=0.5, max_token_length=backend.count_tokens(
        backend.batches[0].requests[-1].messages) + 60 - 1)
    backend2 = ScriptedBackend(tf.verifier_policy({}))
    verifier.verify_paths(backend2, small, [(tf.TASK, low, 0)])
    cut = backend2.batches[0].requests[-1].messages[-1]["content"]
    assert "Step 1 action" not in cut and "Step 2 action: get 1 diamond" in cut and "(step 3)" in cut


def test_unparseable_replies_counted():
    backend = ScriptedBackend(tf.verifier_policy({X[0]: "I cannot decide.\nNo verdict here"}))
    res = run(tf.tree_split_at_root(), CFG, backend)
    assert res.unparseable == 1 and res.first_bad == {"none": 1}
    assert [f["judgement"] for f in res.rows[0]["revise_feedback"]] == ["Uncertain", "Good"]


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
