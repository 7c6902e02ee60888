"""Monte Carlo tree search of one task, as a job of the batch driver.

``TreeSearch.run(client)`` is a generator: it resets the env, then per
iteration walks down from the root by UCT (``select_child``); at a node
without children it yields "N_GEN samples for this conversation" and, when
sent them, steps each new action from the node's state and adds the children.
A terminal child is backed up to the root at once (``backpropagate``); nodes
are never rolled out. The driver (agent_r.driver) answers the requests of many
trees with one model call; the run around it (files, manifest, progress) is
agent_r/search.py.

Node selection: only non-terminal children are candidates; an unvisited child
scores +infinity, the others value/visits + c * sqrt(ln(parent visits) /
visits); ties are broken by the tree's own seeded generator. A child is
terminal when the env says done, on a disaster (negative reward, scored 0) or
beyond MAX_DEPTH.

A tree depends only on (seed, task idx, model outputs): request seeds and the
tie-breaking generator are derived from them, never from batch composition,
so how many trees run side by side changes speed, not results.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Generator, Optional

from agent_r.conversation import append_turn, clean_observation, initial_conversation, normalise_turn, parse_action
from agent_r.envs import EnvSpec
from agent_r.llm import GenerationRequest, derive_seed
from agent_r.tree import EXPLORATION_C, Node


@dataclass(frozen=True)
class MCTSConfig:
    """What decides one tree besides the model: built from SearchSettings by
    agent_r.search.mcts_config."""

    iterations: int               # ITERA
    n_gen: int                    # N_GEN: samples per expansion, one request
    max_depth: int                # a node deeper than this is terminal
    seed: int = 0
    c: float = EXPLORATION_C      # the UCT exploration constant


@dataclass
class TreeStats:
    iterations: int = 0        # search iterations actually run
    expansions: int = 0        # model requests (one per expanded node, n = N_GEN each)
    samples: int = 0           # model turns received
    duplicates: int = 0        # exact duplicate turns dropped before any env work
    env_resets: int = 0
    env_steps: int = 0         # every client.step, replays included
    replays_skipped: int = 0   # children stepped from a client already at the node's state
    env_requests: int = 0      # HTTP round trips of the child steps (replays, action mapping, steps)
    env_replays: int = 0       # replays the server did in one request (POST /replay), each with its step
    nodes: int = 0
    leaves: int = 0
    successful_leaves: int = 0
    max_depth: int = 0
    root_value: float = 0.0
    env_restarts: int = 0      # searches restarted from the root after an env error
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_position(node: Node) -> tuple[int, ...]:
    """Child indices from the root to ``node``: its stable address in the tree."""
    pos = []
    while node.parent is not None:
        pos.append(node.parent.children.index(node))
        node = node.parent
    return tuple(pos[::-1])


def request_seed(seed: int, idx: int, node: Node) -> int:
    return derive_seed(seed, idx, "expand", ".".join(map(str, node_position(node))))


def select_child(node: Node, c: float, rng: random.Random) -> Optional[Node]:
    """UCT among non-terminal children, ties broken by ``rng``; None (and the
    node marked terminal) when every child is terminal."""
    candidates = [child for child in node.children if not child.is_terminal]
    if not candidates:
        node.is_terminal = True
        return None
    scores = [child.selection_score(c) for child in candidates]
    best = max(scores)
    tied = [child for child, score in zip(candidates, scores) if score == best]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def selection_rng(seed: int, idx: int) -> random.Random:
    """The tie-breaking generator of one tree."""
    return random.Random(derive_seed(seed, idx, "select"))


class TreeSearch:
    """The search of one task, as a driver job (agent_r.driver). ``run(client)``
    yields a GenerationRequest (untruncated messages, n = N_GEN, derived seed),
    is sent the samples, and returns the root. After an env error the driver
    calls ``run`` again on a fresh client: the search starts over from the root
    and, with a deterministic backend, rebuilds the identical tree (seeds depend
    only on node positions; the tie-break generator starts over)."""

    def __init__(self, idx: int, spec: EnvSpec, config: MCTSConfig):
        self.idx, self.key = idx, str(idx)
        self.spec = spec
        self.config = config
        self.stats = TreeStats()
        self.client: Any = None
        self._runs = 0
        self.rng = selection_rng(config.seed, idx)
        self._at: Optional[list[str]] = None  # actions the client has taken since its last reset

    def run(self, client: Any) -> Generator[GenerationRequest, list[str], Node]:
        if self._runs:
            self.stats.env_restarts += 1
        self._runs += 1
        started = time.perf_counter()
        try:
            root = yield from self._search(client)
        finally:
            self.stats.seconds += time.perf_counter() - started
        self._final_stats(root)
        return root

    def _search(self, client: Any) -> Generator[GenerationRequest, list[str], Node]:
        self.rng = selection_rng(self.config.seed, self.idx)
        self.client = client
        root = self._new_root()
        for _ in range(self.config.iterations):
            if root.is_terminal:
                break
            self.stats.iterations += 1
            node: Optional[Node] = root
            while node is not None:
                if not node.children:
                    seed = request_seed(self.config.seed, self.idx, node)
                    samples = yield GenerationRequest(messages=node.state, n=self.config.n_gen, seed=seed)
                    self._expand(node, samples)
                node = self._select(node)
        return root

    def _new_root(self) -> Node:
        self.client.reset(self.idx)
        self.stats.env_resets += 1
        self._at = []
        state = initial_conversation(self.client.instruction, self.client.observe())
        return Node(state=state)

    def _select(self, node: Node) -> Optional[Node]:
        return select_child(node, self.config.c, self.rng)

    def _expand(self, node: Node, samples: list[str]) -> None:
        if not samples:
            raise RuntimeError(f"task {self.idx}: the backend returned no samples for an expansion")
        self.stats.expansions += 1
        self.stats.samples += len(samples)
        turns: list[str] = []
        for sample in samples:
            turn = normalise_turn(sample)
            if turn in turns:
                self.stats.duplicates += 1
            else:
                turns.append(turn)
        for turn in turns:
            action, out = self._step_from(node, parse_action(turn))
            score = self.spec.step_score(float(out.reward))
            obs = clean_observation(str(out.state))
            depth = node.depth + 1
            node.add_child(Node(
                obs=obs,
                llm_response=turn,
                depth=depth,
                is_terminal=bool(out.done) or score.disaster or depth > self.config.max_depth,
                recent_actions=node.recent_actions + [self.spec.history_entry(action, obs)],
                action=action,
                env_score=score.score,
                disaster=score.disaster,
                state=append_turn(node.state, turn, str(out.state)),
            ))
        for child in node.children:
            if child.is_terminal:
                backpropagate(child)

    def _step_from(self, node: Node, action: str) -> tuple[str, Any]:
        """Bring the client to ``node`` (reset + replay, unless it already stands
        there), then step ``action``. Returns the action actually stepped.
        A client with ``replay`` (agentenv_client) sends the reset and the
        replay as one request where the server allows it; the counts of resets
        and steps are the same either way (what the env did)."""
        history = [n.action for n in node.path_from_root()]
        sent = (getattr(self.client, "http_requests", 0), getattr(self.client, "replay_requests", 0))
        if self._at == history:
            self.stats.replays_skipped += 1
        else:
            self._at = None  # unknown until the replay succeeds
            if hasattr(self.client, "replay"):
                self.client.replay(self.idx, history)
            else:
                self.client.reset(self.idx)
                for past in history:
                    self.client.step(past)
            self.stats.env_resets += 1
            self.stats.env_steps += len(history)
        self._at = None
        prepared = self.spec.prepare_action(self.client, action)
        out = self.client.step(prepared)
        self.stats.env_steps += 1
        self._at = history + [prepared]
        self.stats.env_requests += getattr(self.client, "http_requests", 0) - sent[0]
        self.stats.env_replays += getattr(self.client, "replay_requests", 0) - sent[1]
        return prepared, out

    def _final_stats(self, root: Node) -> None:
        leaves = [n for n in root.iter_nodes() if n is not root and n.is_terminal and not n.children]
        self.stats.nodes = sum(1 for _ in root.iter_nodes())
        self.stats.leaves = len(leaves)
        self.stats.successful_leaves = sum(1 for n in leaves if self.spec.is_success(n.env_score))
        self.stats.max_depth = max(n.depth for n in root.iter_nodes())
        self.stats.root_value = float(root.value)


def backpropagate(leaf: Node) -> None:
    """Add one visit and the leaf's score on the way to the root; a node passed
    becomes terminal when all of its children are."""
    node: Optional[Node] = leaf
    while node is not None:
        node.visits += 1
        node.value += leaf.env_score
        node.is_terminal = all(c.is_terminal for c in node.children)
        node = node.parent
