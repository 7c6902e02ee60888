"""Promises no test checked until the mutation run (bench/mutation.py) planted
a bug there and the whole suite passed: each test here fails on such a bug."""
from __future__ import annotations

import os
import random

from agent_r import export, revision, verifier
from agent_r.envs import get_env
from agent_r.io import atomic_write_text
from agent_r.llm import Backend, RequestFailed
from agent_r.revision_data import PathSettings
from agent_r.search import SearchSettings
from agentenv_client.textcraft import TextCraftEnvClient
from tests.support.tree_fixtures import add_step, backup, make_root


def test_verdict_counts_the_unparseable_replies():
    verdict = verifier.make_verdict([verifier.GOOD, None, None, verifier.BAD], ["a", "?", "?", "b"])
    assert verdict.unparseable == 2 and verdict.labels[1] == verifier.UNCERTAIN and verdict.first_bad == 4


def test_one_pair_per_tree_keeps_exactly_one():
    root = make_root()
    for k in range(3):
        add_step(root, f"get {k + 1} oak log", "Got it", score=1.0)
        add_step(root, f"craft {k} stick", "Could not craft", score=0.0)
    paths = [[leaf] for leaf in backup(root).children]
    cfg = PathSettings(task="textcraft", max_pairs_per_tree=1).revision_config()
    assert len(revision.select_pairs(paths, cfg, random.Random(0))) == 1
    every = PathSettings(task="textcraft", max_pairs_per_tree=0).revision_config()
    assert len(revision.select_pairs(paths, every, random.Random(0))) == 9


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


def test_search_settings_take_the_tasks_depth_and_the_turn_limit():
    settings = SearchSettings(task="sciworld", max_new_tokens=37)
    settings.finish()
    assert settings.max_depth == get_env("sciworld").max_depth
    assert settings.sampling().max_new_tokens == 37


def test_seeded_good_sample_choice_repeats_and_depends_on_the_seed():
    revisions = [{"revise_log": [{"role": "user", "content": f"r{i}"}]} for i in range(3)]
    goods = [{"revise_log": [{"role": "user", "content": f"g{i}"}]} for i in range(40)]
    first = export.xtuner_samples(revisions, goods, 1.0, seed=7)
    assert first == export.xtuner_samples(revisions, goods, 1.0, seed=7) and len(first) == 6
    assert any(export.xtuner_samples(revisions, goods, 1.0, seed=s) != first for s in range(8, 12))


def test_atomic_write_keeps_its_temp_file_hidden_beside_the_target(tmp_path, monkeypatch):
    """The temp file lives in the target's folder (a rename across file
    systems is not atomic) under a dot name no output glob matches."""
    seen = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append((src, dst)), real(src, dst))[1])
    target = tmp_path / "search_results_3.json"
    atomic_write_text(target, "ü\n")
    ((src, dst),) = seen
    src = os.fspath(src)
    assert os.path.dirname(src) == str(tmp_path) and os.fspath(dst) == str(target)
    name = os.path.basename(src)
    assert name.startswith(".search_results_3.json.") and name.endswith(".tmp")
    assert target.read_bytes() == "ü\n".encode("utf-8") and list(tmp_path.iterdir()) == [target]


def test_textcraft_client_info_after_reset(textcraft_server):
    """The AgentGym client's ``info`` after a reset: the task's observation, no reward yet, not done."""
    client = TextCraftEnvClient(textcraft_server, 3)
    try:
        client.reset(1)
        assert set(client.info) >= {"observation", "reward", "done"}
        assert client.info["observation"].startswith("Crafting commands:")
        assert client.info["reward"] == 0 and client.info["done"] is False
    finally:
        client.close()


def test_a_step_that_ends_the_episode_is_a_terminal_leaf(textcraft_server):
    """Solved (done) nodes are leaves: the search never steps past an
    episode's end, however deep MAX_DEPTH allows."""
    from agent_r.search import search_trees
    from tests.support.tree_fixtures import expert_or_mistake_backend

    spec, roots = get_env("textcraft"), []
    search_trees([1, 3], spec, lambda: spec.make_client(textcraft_server), expert_or_mistake_backend(),
                 SearchSettings(max_depth=20, iterations=6, n_gen=2, concurrency=2),
                 on_tree=lambda outcome: roots.append(outcome.result))
    solved = [n for root in roots for n in root.iter_nodes() if n.env_score == 1.0]
    assert solved and all(n.is_terminal and not n.children for n in solved)
