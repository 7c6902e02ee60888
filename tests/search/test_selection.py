"""Node selection and backpropagation: UCT picks among non-terminal children
(unvisited first, ties by the tree's seeded generator, the exploration term
weighted by c = 0.25 and the parent's visits), a node with only terminal
children becomes terminal, and a backed-up leaf adds one visit and its score
on the way to the root; whole searches differ when c does."""
from __future__ import annotations

import json
import math
import random

import pytest

from agent_r.mcts import backpropagate, select_child, selection_rng
from agent_r.search import SearchSettings, search_trees
from agent_r.settings import parse
from agent_r.tree import EXPLORATION_C, Node
from tests.support.search_doubles import SeededTextCraftDouble
from tests.support.search_runs import C, TEXTCRAFT


def _node(visits, value, terminal=False):
    return Node(visits=visits, value=value, is_terminal=terminal)


def test_selection_rule():
    rng = selection_rng(3, 5)
    parent = Node(visits=10, value=3.0)
    kids = [parent.add_child(_node(4, 3.0)), parent.add_child(_node(2, 0.0)), parent.add_child(_node(1, 1.0, True))]
    # UCT: 0.75 + .25*sqrt(ln10/4) = 0.94 vs 0 + .25*sqrt(ln10/2) = 0.27; the terminal child is never picked.
    assert select_child(parent, C, rng) is kids[0]
    unvisited = parent.add_child(_node(0, 0.0))
    assert select_child(parent, C, rng) is unvisited
    # ties among unvisited children: uniformly at random from the tree's seeded generator
    parent2 = Node(visits=1)
    twins = [parent2.add_child(_node(0, 0.0)) for _ in range(4)]
    assert select_child(parent2, C, selection_rng(3, 5)) is twins[selection_rng(3, 5).choice(range(4))]
    # no non-terminal child: the node becomes terminal and selection ends
    dead = Node(visits=2)
    dead.add_child(_node(1, 0.0, True))
    dead.add_child(_node(1, 1.0, True))
    assert select_child(dead, C, rng) is None and dead.is_terminal


def test_backpropagate_marks_terminal_only_when_all_children_are():
    root = Node()
    mid = root.add_child(Node(depth=1))
    other = root.add_child(Node(depth=1))
    leaf1 = mid.add_child(Node(depth=2, is_terminal=True, env_score=1.0))
    mid.add_child(Node(depth=2, is_terminal=False))
    backpropagate(leaf1)
    assert (root.visits, root.value, mid.visits, mid.value) == (1, 1.0, 1, 1.0)
    assert not mid.is_terminal and not root.is_terminal
    mid.children[1].is_terminal = True
    mid.children[1].env_score = 0.5
    backpropagate(mid.children[1])
    assert mid.is_terminal and not root.is_terminal and root.value == 1.5 and root.visits == 2
    other.is_terminal = True
    leaf3 = other.add_child(Node(depth=2, is_terminal=True))
    backpropagate(leaf3)
    assert root.is_terminal


def explore_or_exploit() -> tuple[Node, Node, Node]:
    """A parent visited 100 times: A is well explored and good on average
    (30 / 50 = 0.6), B barely explored (1.0 / 2 = 0.5). Exploitation alone
    picks A; with c = 0.25 the exploration term of B (0.25 * sqrt(ln 100 / 2)
    = 0.38) outweighs A's (0.08)."""
    parent = Node(visits=100, value=31.0)
    a = parent.add_child(Node(visits=50, value=30.0, depth=1))
    b = parent.add_child(Node(visits=2, value=1.0, depth=1))
    return parent, a, b


def test_selection_uses_the_exploration_term():
    parent, a, b = explore_or_exploit()
    assert EXPLORATION_C == 0.25
    assert b.selection_score(0.25) == pytest.approx(0.5 + 0.25 * math.sqrt(math.log(100) / 2))
    assert a.selection_score(0.25) == pytest.approx(0.6 + 0.25 * math.sqrt(math.log(100) / 50))
    assert select_child(parent, 0.25, random.Random(0)) is b      # c decides ...
    assert select_child(parent, 0.0, random.Random(0)) is a       # ... without it, the mean wins
    assert select_child(parent, EXPLORATION_C, random.Random(0)) is b


def test_selection_counts_the_parents_visits():
    """The exploration term grows with the parent's visits: the same two
    children swap rank when the parent has been visited more."""
    for parent_visits, winner in ((3, "a"), (1000, "b")):
        parent = Node(visits=parent_visits)
        a = parent.add_child(Node(visits=2, value=1.5))    # 0.75 + c*sqrt(ln P / 2)
        b = parent.add_child(Node(visits=1, value=0.6))    # 0.6 + c*sqrt(ln P): ahead once ln P > 4.2
        assert select_child(parent, 0.25, random.Random(0)) is {"a": a, "b": b}[winner]


def trees(server: str, c: float | None, indices=(2, 8)) -> dict[int, str]:
    kwargs = {} if c is None else {"c": c}
    out: dict[int, str] = {}
    search_trees(list(indices), TEXTCRAFT, lambda: TEXTCRAFT.make_client(server), SeededTextCraftDouble(),
                 SearchSettings(max_depth=4, iterations=8, n_gen=3, concurrency=2, **kwargs),
                 on_tree=lambda o: out.__setitem__(o.job.idx, json.dumps(o.result.to_dict())))
    return out


def test_the_search_selects_with_its_c(textcraft_server):
    """Whole searches (same double, same seeds): c = 0 builds other trees
    than the default c = 0.25 on these tasks, and the default is 0.25."""
    default, paper, greedy = trees(textcraft_server, None), trees(textcraft_server, 0.25), \
        trees(textcraft_server, 0.0)
    assert default == paper
    assert all(paper[i] != greedy[i] for i in paper)
    assert parse(SearchSettings, [], {"TASK": "textcraft"}).c == 0.25
    assert parse(SearchSettings, ["--exploration_c", "0"], {"TASK": "textcraft"}).c == 0.0
