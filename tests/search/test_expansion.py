"""What an expansion adds to a tree, against the real local env servers: one
request of N_GEN samples from the node's conversation (truncated for the
model only, sampled at TEMP), duplicates dropped before any env work, each
child stepped from the node's state with its score, history and messages; a
disaster (negative reward) is a terminal child scored 0, a child beyond
MAX_DEPTH is terminal, and terminal children are backed up at once."""
from __future__ import annotations

import math
import re

import pytest

from agent_r import envs
from agent_r.conversation import initial_conversation
from agent_r.mcts import request_seed, selection_rng
from agent_r.search import SearchSettings, collect_trees, search_trees
from agent_r.settings import parse
from tests.support.doubles import ScriptedBackend
from tests.support.search_doubles import seeded_textcraft_policy
from tests.support.search_runs import C, TEXTCRAFT, run


def solution_for(observation: str) -> tuple[str, str]:
    """(get, craft) solving a one-recipe task, read off the observation."""
    goal = re.search(r"Goal: craft (.+)\.", observation).group(1)
    for line in observation.splitlines():
        m = re.match(r"craft (\d+) (.+) using (\d+) (.+)$", line.strip())
        if m and m.group(2) == goal and "," not in m.group(4):
            return f"get {m.group(3)} {m.group(4)}", line.strip()
    raise AssertionError(f"no single-ingredient recipe for {goal} in {observation!r}")


def test_scripted_tree_matches_hand_computation(textcraft_server):
    idx = 1  # a train task: "craft 3 acacia wood using 4 acacia log"
    with TEXTCRAFT.make_client(textcraft_server) as client:
        client.reset(idx)
        get, craft = solution_for(client.observe())

    def policy(messages, i, seed):
        turns = (len(messages) - 4) // 2
        if turns == 0:  # root: the right first move, a premature craft, a numbered duplicate of sample 0
            return ["Thought: I need logs.\nAction: get 4 acacia log".replace("get 4 acacia log", get),
                    f"Thought: craft it.\nAction: {craft}",
                    f"Thought 1: I need logs.\nAction 1: {get}"][i]
        return [f"Action: {craft}", "Action: inventory", "Action: inventory"][i]

    backend = ScriptedBackend(policy)
    results, driver, made = run([idx], textcraft_server, backend, max_depth=1, iterations=3, n_gen=3)
    res = results[idx]
    assert res.error is None
    root = res.result
    a, b = root.children  # the duplicate was dropped before any env work
    assert [a.action, b.action] == [get, craft]
    assert a.llm_response == "Thought: I need logs.\nAction: " + get
    (a_craft, a_inv), (b_craft, b_inv) = a.children, b.children

    # Scores and terminal flags: only the craft after the get succeeds; depth 2 > MAX_DEPTH 1 ends the rest.
    assert a_craft.env_score == 1.0 and a_craft.obs.startswith("Crafted")
    assert b.obs.startswith("Could not") and b_craft.env_score == 0.0 and b_craft.obs.startswith("Could not")
    assert all(n.is_terminal for n in (root, a, b, a_craft, a_inv, b_craft, b_inv))
    assert not any(n.disaster for n in root.iter_nodes())

    # Backprop: every leaf once; A holds the success.
    assert (root.visits, root.value) == (4, 1.0)
    assert (a.visits, a.value) == (2, 1.0) and (b.visits, b.value) == (2, 0.0)
    for leaf in (a_craft, a_inv, b_craft, b_inv):
        assert leaf.visits == 1 and leaf.value == leaf.env_score and leaf.children == []

    # Saved selection scores.
    d = root.to_dict()
    assert d["puct_value"] == 0.25
    assert d["children"][0]["puct_value"] == pytest.approx(0.5 + C * math.sqrt(math.log(4) / 2))
    assert d["children"][0]["children"][0]["puct_value"] == pytest.approx(1 + C * math.sqrt(math.log(2)))

    # History, conversation and node layout.
    assert a_craft.recent_actions == [[get, a.obs], [craft, a_craft.obs]]
    assert a_craft.state[:4] == root.state[:4] and len(a_craft.state) == 8
    assert a_craft.state[-2:] == [{"role": "assistant", "content": f"Action: {craft}"},
                                 {"role": "user", "content": a_craft.obs}]
    assert [n.depth for n in (root, a, a_craft)] == [0, 1, 2]

    # Selection order: the root's two unvisited children tie; the tree's seeded generator picks.
    first = [a, b][selection_rng(0, idx).choice([0, 1])]
    second = b if first is a else a
    batches = backend.batches
    assert [len(x.requests) for x in batches] == [1, 1, 1]
    assert [x.requests[0].n for x in batches] == [3, 3, 3]
    assert batches[1].requests[0].messages[-1]["content"] == first.obs
    assert batches[2].requests[0].messages[-1]["content"] == second.obs
    assert [x.requests[0].seed for x in batches] == [request_seed(0, idx, n) for n in (root, first, second)]

    # Stats: 2 real iterations (the third finds the root terminal), 3 of 9 samples were duplicates.
    s = res.job.stats
    assert (s.iterations, s.expansions, s.samples, s.duplicates) == (2, 3, 9, 3)
    assert (s.nodes, s.leaves, s.successful_leaves, s.max_depth) == (7, 4, 1, 2)
    # Env work: root reset; A stepped from the fresh reset (no replay); every other child resets and
    # replays, except the first child of whichever root child was stepped last (B) when B goes first.
    b_first = first is b
    assert s.env_steps == (9 if b_first else 10) and s.env_resets == (5 if b_first else 6)
    assert s.replays_skipped == (2 if b_first else 1)
    assert len(made) == 1 and made[0]._closed


def test_disaster_is_terminal_with_score_zero(sciworld_server):
    """The real ScienceWorld server fails game 0 (boil water) on a wrong
    focus with reward -100: a disaster, terminal, score 0."""
    spec = envs.get_env("sciworld")
    backend = ScriptedBackend(lambda m, i, s: ["Action: focus on picture", "Action: look around"][i])
    made, results = [], []

    def make_client():
        made.append(spec.make_client(sciworld_server))
        return made[-1]

    search_trees([0], spec, make_client, backend,
                 SearchSettings(task="sciworld", max_depth=1, iterations=1, n_gen=2), on_tree=results.append)
    assert results[0].error is None
    root = results[0].result
    focus, look = root.children
    assert focus.disaster and focus.is_terminal and focus.env_score == 0.0 and focus.visits == 1
    assert focus.obs.startswith("You focus on the picture")
    assert not look.disaster and look.visits == 2  # the iteration went on below it
    assert focus.recent_actions == [f"(focus on picture, {focus.obs})"]  # SciWorld keeps the reference's string form
    # look's children are a disaster and a depth-2 node (> MAX_DEPTH): all terminal, so look and the root are
    assert [c.disaster for c in look.children] == [True, False] and all(c.is_terminal for c in look.children)
    assert look.is_terminal and root.is_terminal and (root.visits, root.value) == (3, 0.0)
    assert made and all(c._closed for c in made)


def test_truncation_applies_to_the_model_prompt_only(textcraft_server):
    seen = []

    def policy(messages, i, seed):
        seen.append(len(messages))
        return "Thought: " + "word " * 30 + "\nAction: inventory"

    backend = ScriptedBackend(policy)
    with TEXTCRAFT.make_client(textcraft_server) as client:
        client.reset(1)
        head = backend.count_tokens(initial_conversation(client.instruction, client.observe()))
    # ScriptedBackend counts words; a pair here is ~36 words: room for two pairs, not four.
    results, _, _ = run([1], textcraft_server, backend, max_depth=4, iterations=1, n_gen=1,
                        max_token_length=head + 60 + 80)
    root = results[1].result
    deepest = max(root.iter_nodes(), key=lambda n: n.depth)
    assert len(deepest.state) == 4 + 2 * deepest.depth  # stored state keeps every turn
    assert max(seen) < len(deepest.state) and min(seen) == 4
    assert all(n % 2 == 0 for n in seen)  # pairs dropped, roles stay aligned


def test_temp_reaches_the_sampler_in_search(tmp_path, textcraft_server):
    settings = parse(SearchSettings, ["--env_server_base", textcraft_server, "--output_dir", str(tmp_path),
                                      "--model_name", "m", "--min", "1", "--max", "3"],
                     {"TASK": "textcraft", "TEMP": "0.35", "ITERA": "2", "MAX_DEPTH": "2", "N_GEN": "2"})
    backend = ScriptedBackend(seeded_textcraft_policy)
    summary = collect_trees(settings, backend=backend)
    assert summary.done == 2 and backend.batches
    assert {b.sampling.temperature for b in backend.batches} == {0.35}
