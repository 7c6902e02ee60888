"""The verifier at its edges: replies without a judgement, a prompt that fails
alone, and the exact prompt words the bundled model was trained on."""
from __future__ import annotations

from agent_r import verifier
from agent_r.llm import Backend, RequestFailed
from agent_r.revision_data import PathSettings
from tests.support.tree_fixtures import add_step, backup, make_root


def test_verdict_counts_the_unparseable_replies():
    """Replies without a judgement count as unparseable and read as Uncertain;
    the first Bad step is the one judged Bad."""
    verdict = verifier.make_verdict([verifier.GOOD, None, None, verifier.BAD], ["a", "?", "?", "b"])
    assert verdict.unparseable == 2 and verdict.labels[1] == verifier.UNCERTAIN and verdict.first_bad == 4


class FailsOnePrompt(Backend):
    """Test double (not a model): judges every step Good, except that the
    prompt of the step whose action contains "craft" fails alone, as a
    prompt too long for the model's context does."""

    name = "fails-one"

    def generate(self, requests, sampling):
        return [RequestFailed("too long") if "Action: craft" in r.messages[-1]["content"]
                else ["The step is fine.\nJudgment: Good"] for r in requests]

    def count_tokens(self, messages):
        return sum(len(m["content"].split()) for m in messages)


def test_a_verifier_prompt_that_fails_alone_reads_as_unparseable():
    """A step whose prompt alone fails (too long) is judged Uncertain with an
    empty reply; the other steps of the batch keep their judgements."""
    root = make_root()
    leaf = add_step(add_step(root, "get 1 oak log", "Got 1 oak log"), "craft 4 oak planks using 1 oak log",
                    "Crafted", score=0.0)
    backup(root)
    cfg = PathSettings(task="textcraft").revision_config()
    (verdict,), counts = verifier.verify_paths(FailsOnePrompt(), cfg, [("Goal: craft stick.", [leaf.parent, leaf], 0)])
    assert verdict.labels == [verifier.GOOD, verifier.UNCERTAIN] and verdict.replies[1] == ""
    assert counts == [(2, 1)]


def test_the_verifier_prompt_is_the_one_the_bundled_model_learned():
    """models/textcraft-tiny was trained on these exact words: a rewording
    costs it its judgements (retrain it with scripts/make_verifier_data.py)."""
    messages = verifier.verifier_messages("Goal: craft stick.", [], "get 1 oak log", "Got 1 oak log", 1)
    assert messages[0] == {"role": "system", "content": "You are a careful reviewer of agent trajectories."}
    assert messages[1]["content"].startswith(
        "You are checking the work of an agent that acts in a text environment to complete a task.\n\n")
    assert "(none: this is the first step)" in messages[1]["content"]
