"""SPEC section 4 promises about revision data that no other test pins, written
against the public functions (agent_r.revision, agent_r.revision_data) and the
CLI: ALPHA is a strict lower bound on the high path and BETA a strict gap,
each applied to its own comparison (different values, and every environment's
defaults); the verifier prompt carries the step's action, its observation and
the history before it; every revision thought can be drawn."""
from __future__ import annotations

import json
import math

import pytest

from agent_r import envs, revision
from agent_r.revision_data import PathSettings
from agent_r.settings import parse
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend
from tests.support.faults import run_script


def config(task: str = "textcraft", **overrides) -> revision.RevisionConfig:
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


def test_alpha_bounds_the_high_path_and_beta_the_gap_each_strictly():
    """ALPHA 0.5 and BETA 0.25 (different, so swapping them shows): a pair
    needs high > ALPHA (0.5 itself is not enough, even with a gap of 0.5) and
    a gap > BETA (a gap of exactly 0.25 is not enough)."""
    root = tf.tree_scored([1.0, 0.75, 0.5, 0.25, 0.0])
    pairs = score_pairs(root, config(alpha=0.5, beta=0.25))
    assert pairs == {(1.0, 0.5), (1.0, 0.25), (1.0, 0.0), (0.75, 0.25), (0.75, 0.0)}
    # the thresholds swapped would give another set: each is applied to its own comparison
    assert score_pairs(root, config(alpha=0.25, beta=0.5)) == {(1.0, 0.25), (1.0, 0.0), (0.75, 0.0)}
    good = revision.plan_tree(1, root, config(alpha=0.5, beta=0.25, data_type="good"))
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


def test_first_bad_histogram_orders_positions_numerically():
    from collections import Counter

    assert revision.histogram(Counter({"10": 1, "2": 3, "none": 2, "1": 4})) == "1:4 2:3 10:1 none:2"
    assert revision.histogram(Counter({"3": 1})) == "3:1"
    assert revision.histogram(Counter()) == "-"


def verify(policy, **settings):
    """Plan the verifier tree, judge its low path with ``policy``; (rows, backend)."""
    cfg = PathSettings(task="textcraft", revise=True, alpha=0.5, beta=0.5, **settings).revision_config()
    backend = ScriptedBackend(policy)
    (rows,) = revision.process_trees([revision.plan_tree(1, verifier_tree(), cfg)], cfg, backend)
    return rows, backend


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
