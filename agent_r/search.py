"""Monte Carlo tree search over an AgentGym environment (SPEC section 3),
batched across trees.

The reference searched one tree at a time and asked the model for one sample
per call, so a GPU sat idle between tiny requests. Here each tree's search is a
generator (``TreeSearch.run``): it yields "N_GEN samples for this conversation"
and is sent the samples back. ``search_trees`` keeps up to ``concurrency`` trees
in flight, answers the pending requests of ALL of them with ONE
``backend.generate`` call, then lets every tree do its env work (reset, replay,
step) at the same time in a thread pool, each tree on its own env client.

A tree depends only on (seed, task idx, model outputs): request seeds and the
tie-breaking generator are derived from them, never from batch composition, so
``concurrency`` changes speed, not results.
"""
from __future__ import annotations

import logging
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generator, Optional

from agent_r.conversation import append_turn, clean_observation, initial_conversation, normalise_turn, parse_action, truncate
from agent_r.llm import Backend, BackendError, GenerationRequest, SamplingConfig, derive_seed
from agent_r.tasks import TaskRules
from agent_r.tree import EXPLORATION_C, Node

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchConfig:
    max_depth: int = 20             # a child deeper than this is terminal
    iterations: int = 8             # ITERA
    n_gen: int = 4                  # samples per expansion (N_GEN)
    temperature: float = 1.0        # TEMP
    max_token_length: int = 4096    # prompt budget, see conversation.truncate
    max_new_tokens: int = 500
    seed: int = 0
    c: float = EXPLORATION_C
    env_retries: int = 2            # restarts of a tree from its root on a fresh env after an env error
    env_retry_delay: float = 1.0    # seconds before the first restart, doubled for each further one

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, max_new_tokens=self.max_new_tokens)


@dataclass
class TreeStats:
    iterations: int = 0        # search iterations actually run
    expansions: int = 0        # model requests (one per expanded node, n = N_GEN each)
    samples: int = 0           # model turns received
    duplicates: int = 0        # exact duplicate turns dropped before any env work
    env_resets: int = 0
    env_steps: int = 0         # every client.step, replays included
    replays_skipped: int = 0   # children stepped from a client already at the node's state
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


def selection_rng(seed: int, idx: int) -> random.Random:
    """The tie-breaking generator of one tree."""
    return random.Random(derive_seed(seed, idx, "select"))


class TreeSearch:
    """The search of one task. ``run()`` is a generator: it yields a
    GenerationRequest (untruncated messages, n = N_GEN, derived seed), expects
    the list of samples via ``send``, and returns the root when done. The env
    client is created on the first step and closed when the generator ends or
    is closed."""

    def __init__(self, idx: int, rules: TaskRules, make_client: Callable[[], Any], config: SearchConfig):
        self.idx = idx
        self.rules = rules
        self.make_client = make_client
        self.config = config
        self.rng = selection_rng(config.seed, idx)
        self.stats = TreeStats()
        self.client: Any = None
        self.gen: Optional[Generator] = None  # set by the driver: self.run()
        self._at: Optional[list[str]] = None  # actions the client has taken since its last reset

    # ---- the search ----------------------------------------------------
    def run(self) -> Generator[GenerationRequest, list[str], Node]:
        """The whole search, restarted from the root on a fresh env client after
        an env error (a dropped connection, a restarted server that forgot the
        env), at most ``env_retries`` times. A restart rebuilds the identical
        tree with a deterministic backend: seeds depend only on node positions
        and the tie-break generator starts over."""
        started = time.perf_counter()
        try:
            for attempt in range(self.config.env_retries + 1):
                try:
                    root = yield from self._search()
                    self._final_stats(root)
                    return root
                except _env_errors() as exc:
                    if attempt == self.config.env_retries:
                        raise
                    delay = self.config.env_retry_delay * 2 ** attempt
                    log.warning("task %s: env error (%s); restarting its search from the root on a fresh env "
                                "in %.1fs (retry %d/%d)", self.idx, exc, delay, attempt + 1, self.config.env_retries)
                    self._drop_client()
                    self.stats.env_restarts += 1
                    time.sleep(delay)
            raise AssertionError("unreachable")
        finally:
            self.stats.seconds = time.perf_counter() - started
            self._drop_client()

    def _search(self) -> Generator[GenerationRequest, list[str], Node]:
        self.rng = selection_rng(self.config.seed, self.idx)
        self.client = self.make_client()
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

    def _drop_client(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.debug("closing env client of task %s failed", self.idx, exc_info=True)
            self.client = None

    def _new_root(self) -> Node:
        self.client.reset(self.idx)
        self.stats.env_resets += 1
        self._at = []
        state = initial_conversation(self.client.instruction, self.client.observe())
        return Node(state=state)

    def _select(self, node: Node) -> Optional[Node]:
        """UCT among non-terminal children, seeded random tie-break; None (and
        the node marked terminal) when every child is terminal."""
        candidates = [c for c in node.children if not c.is_terminal]
        if not candidates:
            node.is_terminal = True
            return None
        scores = [c.selection_score(self.config.c) for c in candidates]
        best = max(scores)
        tied = [c for c, s in zip(candidates, scores) if s == best]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

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
            score = self.rules.step_score(float(out.reward))
            obs = clean_observation(str(out.state))
            depth = node.depth + 1
            node.add_child(Node(
                obs=obs,
                llm_response=turn,
                depth=depth,
                is_terminal=bool(out.done) or score.disaster or depth > self.config.max_depth,
                recent_actions=node.recent_actions + [self.rules.history_entry(action, obs)],
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
        there), then step ``action``. Returns the action actually stepped."""
        history = [n.action for n in node.path_from_root()]
        if self._at == history:
            self.stats.replays_skipped += 1
        else:
            self._at = None  # unknown until the replay succeeds
            self.client.reset(self.idx)
            self.stats.env_resets += 1
            for past in history:
                self.client.step(past)
                self.stats.env_steps += 1
        self._at = None
        prepared = self.rules.prepare_action(self.client, action)
        out = self.client.step(prepared)
        self.stats.env_steps += 1
        self._at = history + [prepared]
        return prepared, out

    def _final_stats(self, root: Node) -> None:
        leaves = [n for n in root.iter_nodes() if n is not root and n.is_terminal and not n.children]
        self.stats.nodes = sum(1 for _ in root.iter_nodes())
        self.stats.leaves = len(leaves)
        self.stats.successful_leaves = sum(1 for n in leaves if self.rules.is_success(n.env_score))
        self.stats.max_depth = max(n.depth for n in root.iter_nodes())
        self.stats.root_value = float(root.value)


def _env_errors() -> tuple[type[BaseException], ...]:
    """Errors worth a fresh env: the server's (EnvServerError, including an
    unreachable server) and the HTTP layer's. Programming errors are not."""
    import requests

    from agentenv_client import EnvServerError

    return (EnvServerError, requests.RequestException)


def _is_fatal(exc: BaseException) -> bool:
    """A tree that failed this way means every other tree will too: stop the run."""
    from agentenv_client import EnvServerUnreachable

    return isinstance(exc, EnvServerUnreachable)


def backpropagate(leaf: Node) -> None:
    """Add one visit and the leaf's score on the way to the root; a node passed
    becomes terminal when all of its children are."""
    node: Optional[Node] = leaf
    while node is not None:
        node.visits += 1
        node.value += leaf.env_score
        node.is_terminal = all(c.is_terminal for c in node.children)
        node = node.parent


# ---- the driver ------------------------------------------------------

@dataclass
class TreeResult:
    idx: int
    root: Optional[Node]
    stats: TreeStats
    error: Optional[BaseException] = None


@dataclass
class DriverStats:
    model_calls: int = 0        # backend.generate invocations made by this driver
    requests: int = 0           # conversations sent (one per expansion)
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def mean_batch(self) -> float:
        return self.requests / self.model_calls if self.model_calls else 0.0


def _advance(tree: TreeSearch, value: Optional[list[str]]) -> Any:
    """One step of a tree: a GenerationRequest, or a finished TreeResult."""
    try:
        return tree.gen.send(value)
    except StopIteration as stop:
        return TreeResult(tree.idx, stop.value, tree.stats)
    except Exception as exc:  # noqa: BLE001 - a failed tree is reported, the run goes on
        return TreeResult(tree.idx, None, tree.stats, exc)


def search_trees(
    indices: list[int],
    rules: TaskRules,
    make_client: Callable[[], Any],
    backend: Backend,
    config: SearchConfig,
    concurrency: int = 8,
    on_result: Callable[[TreeResult], None] | None = None,
) -> DriverStats:
    """Search every task in ``indices``; ``on_result`` gets each finished (or
    failed) tree in the driver's thread. A backend failure aborts the run (after
    closing every open client); an env failure fails only its tree, after the
    tree's restarts from the root; an unreachable server (after those restarts)
    aborts the run, since every other tree would fail the same way."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    stats = DriverStats()
    sampling = config.sampling()
    queue = deque(indices)
    live: list[TreeSearch] = []  # started, not finished
    runnable: list[tuple[TreeSearch, Optional[list[str]]]] = []
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tree") as pool:
            while queue or runnable:
                while queue and len(live) < concurrency:
                    tree = TreeSearch(queue.popleft(), rules, make_client, config)
                    tree.gen = tree.run()
                    live.append(tree)
                    runnable.append((tree, None))
                outcomes = list(pool.map(lambda item: _advance(*item), runnable))
                waiting: list[tuple[TreeSearch, GenerationRequest]] = []
                fatal: Optional[BaseException] = None
                for (tree, _), outcome in zip(runnable, outcomes):
                    if isinstance(outcome, TreeResult):
                        live.remove(tree)
                        if on_result is not None:
                            on_result(outcome)
                        if outcome.error is not None and _is_fatal(outcome.error):
                            fatal = outcome.error
                    else:
                        waiting.append((tree, outcome))
                if fatal is not None:
                    raise fatal
                runnable = []
                if waiting:
                    # Truncation runs here, in one thread: a tokenizer is not
                    # safe to share across the env worker threads.
                    requests = [
                        GenerationRequest(truncate(r.messages, config.max_token_length, backend.count_tokens), r.n, r.seed)
                        for _, r in waiting
                    ]
                    outputs = backend.generate(requests, sampling)
                    if len(outputs) != len(requests):
                        raise BackendError(f"backend {backend.name} answered {len(outputs)} of {len(requests)} requests")
                    stats.model_calls += 1
                    stats.requests += len(requests)
                    stats.batch_sizes.append(len(requests))
                    runnable = [(tree, list(out)) for (tree, _), out in zip(waiting, outputs)]
    finally:
        # After the pool has shut down (it waits for running env work, also on
        # Ctrl-C), no generator is executing, so closing each one runs its
        # finally and frees its remote env.
        for tree in live:
            try:
                tree.gen.close()
            except Exception:  # noqa: BLE001 - one tree's cleanup must not stop the others'
                log.warning("task %s: could not stop its search cleanly", tree.idx, exc_info=True)
    return stats
