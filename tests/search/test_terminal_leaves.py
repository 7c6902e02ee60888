"""Where a search branch ends: a step that ends the episode makes a terminal
leaf, never expanded further, however deep MAX_DEPTH allows."""
from __future__ import annotations

from agent_r.envs import get_env
from agent_r.search import SearchSettings, search_trees
from tests.support.tree_fixtures import expert_or_mistake_backend


def test_a_step_that_ends_the_episode_is_a_terminal_leaf(textcraft_server):
    """Solved (done) nodes are leaves: the search never steps past an
    episode's end, however deep MAX_DEPTH allows."""
    spec, roots = get_env("textcraft"), []
    search_trees([1, 3], spec, lambda: spec.make_client(textcraft_server), expert_or_mistake_backend(),
                 SearchSettings(max_depth=20, iterations=6, n_gen=2, concurrency=2),
                 on_tree=lambda outcome: roots.append(outcome.result))
    solved = [n for root in roots for n in root.iter_nodes() if n.env_score == 1.0]
    assert solved and all(n.is_terminal and not n.children for n in solved)
