"""The verifier: its prompt carries the task, the judged step's action and
observation and every earlier step (never a later one), dropping the oldest
history only past MAX_TOKEN_LENGTH - 60; only the label after the last
Judgment marker counts and an unreadable reply is counted and read as
Uncertain; every distinct step of every low path of a batch of trees is
judged in one model call, one seeded reply each at the verifier's TEMP."""
from __future__ import annotations

import pytest

from agent_r import revision, verifier
from agent_r.revision_data import PathSettings
from agent_r.verifier import parse_judgement
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend
from tests.support.revision_cases import CFG, X, config, run, verifier_tree, verify


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


def test_verifier_prompt_carries_the_step_its_observation_and_the_history():
    prompts = []

    def policy(messages, i, seed):
        prompts.append("\n".join(m["content"] for m in messages))
        return "Looks fine.\nJudgment: Good"

    cfg = PathSettings(task="textcraft", revise=True, alpha=0.5, beta=0.5).revision_config()
    plan = revision.plan_tree(1, verifier_tree(), cfg)
    revision.process_trees([plan], cfg, ScriptedBackend(policy))
    assert len(prompts) == 3                           # one per step of the low path
    steps = [("act-one", "obs-one"), ("act-two", "obs-two"), ("act-three", "obs-three")]
    for k, prompt in enumerate(prompts):
        assert "TASK-TOKEN" in prompt
        action, obs = steps[k]
        assert action in prompt and obs in prompt       # the step judged, with what it produced
        for a, o in steps[:k]:                          # every earlier step and its observation
            assert a in prompt and o in prompt
            assert prompt.index(a) < prompt.index(action)
        for a, o in steps[k + 1:]:                      # never a later one
            assert a not in prompt and o not in prompt
        assert "act-good" not in prompt and "obs-good" not in prompt


def test_verifier_prompt_pairs_each_observation_with_its_own_action():
    """The observation shown for the judged step is the one its action
    produced, not the previous step's (they are adjacent in the tree)."""
    prompts = []
    cfg = PathSettings(task="textcraft", revise=True, alpha=0.5, beta=0.5).revision_config()
    plan = revision.plan_tree(1, verifier_tree(), cfg)
    revision.process_trees([plan], cfg, ScriptedBackend(
        lambda messages, i, seed: prompts.append(messages[-1]["content"]) or "ok\nJudgment: Good"))
    last = prompts[2]
    tail = last[last.index("act-three"):]
    assert "obs-three" in tail and "obs-two" not in tail


def test_verifier_prompt_layout_lists_each_earlier_step_on_its_own_lines():
    _, backend = verify(lambda m, i, s: "ok\nJudgment: Good")
    third = backend.batches[0].requests[2].messages
    assert [m["role"] for m in third] == ["system", "user"]
    text = third[1]["content"]
    assert "Step 1 action: act-one\nStep 1 observation: obs-one\nStep 2 action: act-two\n" \
           "Step 2 observation: obs-two" in text
    first = backend.batches[0].requests[0].messages[1]["content"]
    assert "Step 1 action" not in first and "first step" in first


def test_verifier_requests_one_reply_each_with_a_stable_seed_and_its_temperature():
    """TEMP (PathSettings.verifier_temperature) and max_new_tokens reach the
    verifier's sampler; each prompt asks for one reply, seeded from the
    prompt, so a rerun sends the same requests."""
    rows, backend = verify(lambda m, i, s: "ok\nJudgment: Good", verifier_temperature=0.4, max_new_tokens=77)
    (batch,) = backend.batches
    assert (batch.sampling.temperature, batch.sampling.max_new_tokens) == (0.4, 77)
    seeds = [r.seed for r in batch.requests]
    assert all(r.n == 1 for r in batch.requests) and len(set(seeds)) == 3
    assert all(isinstance(s, int) and 0 <= s < 2 ** 31 for s in seeds)
    _, again = verify(lambda m, i, s: "ok\nJudgment: Good", verifier_temperature=0.4, max_new_tokens=77)
    assert [r.seed for r in again.batches[0].requests] == seeds
    assert rows.verifier_prompts == 3


def test_unparseable_verdicts_are_counted():
    replies = {"act-one": "no label here", "act-two": "Judgment: maybe", "act-three": "fine\nJudgment: Good"}
    rows, _ = verify(lambda m, i, s: replies[tf.judged_step(m)[1]])
    assert (rows.verifier_prompts, rows.unparseable) == (3, 2)
    feedback = rows.rows[0]["revise_feedback"]
    assert [f["judgement"] for f in feedback] == ["Uncertain", "Uncertain", "Good"]


def test_verifier_history_is_cut_only_past_the_budget():
    """The prompt keeps its whole history while it fits MAX_TOKEN_LENGTH - 60
    tokens exactly; one token less and the oldest step goes."""
    _, probe = verify(lambda m, i, s: "ok\nJudgment: Good", max_token_length=100_000)
    full = probe.batches[0].requests[2].messages
    size = probe.count_tokens(full)
    _, exact = verify(lambda m, i, s: "ok\nJudgment: Good", max_token_length=size + 60)
    assert exact.batches[0].requests[2].messages == full
    _, tight = verify(lambda m, i, s: "ok\nJudgment: Good", max_token_length=size + 59)
    cut = tight.batches[0].requests[2].messages[1]["content"]
    assert "act-one" not in cut and "act-two" in cut
