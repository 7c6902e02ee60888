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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Optional

from tqdm import tqdm

from agent_r.conversation import append_turn, clean_observation, initial_conversation, normalise_turn, parse_action
from agent_r.driver import DriverConfig, DriverStats, Outcome, run_jobs
from agent_r.envs import EnvSpec, get_env
from agent_r.io import atomic_write_json
from agent_r.llm import BUNDLED_MODEL, Backend, GenerationRequest, SamplingConfig, derive_seed, make_backend
from agent_r.manifest import write_manifest
from agent_r.settings import (BackendSettings, UsageError, concurrency_setting, env_server_setting, manifest_config,
                              max_new_tokens_setting, max_token_length_setting, nested, resolved_model_name,
                              seed_setting, setting, task_setting)
from agent_r.settings import ShardSettings
from agent_r.sharding import describe as describe_shard, manifest_name, shard_items
from agent_r.tree import EXPLORATION_C, Node, TreeFormatError, load_tree

log = logging.getLogger(__name__)


@dataclass
class SearchSettings:
    """Settings of mcts_collection.py (SPEC section 3); env var names are the reference's."""

    task: str = task_setting("textcraft")
    max_depth: Optional[int] = setting(None, env="MAX_DEPTH", flag=None, minimum=0,
                                       help="the depth beyond which a node is terminal (default per task: "
                                       "textcraft 20, sciworld 30, webshop 10)")
    iterations: int = setting(8, env="ITERA", flag=None, minimum=1, help="the number of MCTS iterations per tree (default 8)")
    n_gen: int = setting(4, env="N_GEN", flag=None, minimum=1,
                         help="the number of model samples per expansion, one request with n=N_GEN (default 4)")
    temperature: float = setting(1.0, env="TEMP", flag=None, minimum=0.0, help="the sampling temperature (default 1.0)")
    max_token_length: int = max_token_length_setting("prompt")
    max_new_tokens: int = max_new_tokens_setting()
    seed: int = seed_setting()
    env_server_base: Optional[str] = env_server_setting()
    min: int = setting(0, help="textcraft/webshop: lowest task index searched; sciworld: first position in the "
                       "task-number list (default 0)")
    max: Optional[int] = setting(None, help="textcraft/webshop: task indices < MAX; sciworld: position end in "
                                 "the task-number list (default: no limit)")
    task_num: Optional[int] = setting(None, help="sciworld: search only this task number (position in "
                                      "ScienceWorld's task-name list); default all 23 training task numbers")
    task_iteration: int = setting(5, minimum=1, help="sciworld: variations per task number, positions 1..N of "
                                  "its list (default 5)")
    output_dir: str = setting("mcts_result", help="root of the output tree (default mcts_result)")
    split: Optional[str] = setting(None, help="the named split: its train list is searched and its test tasks "
                                   "never are; agenteval (the paper's lists) or project (default: agenteval where "
                                   "its ids mean the paper's tasks on the server in use, see docs/environments.md)")
    split_file: Optional[str] = setting(None, help="a task list to search instead of the split's train list "
                                        "(AgentGym's [{\"item_id\": ...}] or the release's {\"<id>\": n}); the "
                                        "split's test tasks are still skipped")
    concurrency: int = concurrency_setting("trees searched")
    env_retries: int = setting(2, minimum=0, help="restarts of a tree from its root on a fresh env after an env "
                               "error (default 2)")
    env_retry_delay: float = setting(1.0, minimum=0.0, help="seconds before the first restart, doubled for each "
                                     "further one (default 1)")
    c: float = setting(EXPLORATION_C, flag="--exploration_c", minimum=0.0,
                       help=f"UCT exploration constant (default {EXPLORATION_C}, the paper's)")
    backend: BackendSettings = nested(BackendSettings)
    shard: ShardSettings = nested(ShardSettings)

    def finish(self) -> None:
        """Per-environment defaults (MAX_DEPTH) once TASK is known."""
        spec = get_env(self.task)
        self.task = spec.name
        if self.max_depth is None:
            self.max_depth = spec.max_depth

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, max_new_tokens=self.max_new_tokens)

    def model_name(self) -> str:
        return resolved_model_name(self.backend, BUNDLED_MODEL.name)

    def out_dir(self) -> Path:
        return Path(self.output_dir) / self.task / self.model_name()


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
    node marked terminal) when every child is terminal (SPEC section 3)."""
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

    def __init__(self, idx: int, spec: EnvSpec, settings: SearchSettings):
        self.idx, self.key = idx, str(idx)
        self.spec = spec
        self.settings = settings
        self.stats = TreeStats()
        self.client: Any = None
        self._runs = 0
        self.rng = selection_rng(settings.seed, idx)
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
        self.rng = selection_rng(self.settings.seed, self.idx)
        self.client = client
        root = self._new_root()
        for _ in range(self.settings.iterations):
            if root.is_terminal:
                break
            self.stats.iterations += 1
            node: Optional[Node] = root
            while node is not None:
                if not node.children:
                    seed = request_seed(self.settings.seed, self.idx, node)
                    samples = yield GenerationRequest(messages=node.state, n=self.settings.n_gen, seed=seed)
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
        return select_child(node, self.settings.c, self.rng)

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
                is_terminal=bool(out.done) or score.disaster or depth > self.settings.max_depth,
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
        A client with ``replay`` (agentenv_client) sends the reset, the replay
        and the step as one request where the server allows it; the counts of
        resets and steps are the same either way (what the env did)."""
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


# ---- a whole run ------------------------------------------------------

@dataclass
class SearchSummary:
    done: int = 0
    skipped: int = 0
    failed: list[int] = field(default_factory=list)
    leaves: int = 0
    successful_leaves: int = 0
    env_steps: int = 0
    mean_batch: float = 0.0
    wall_s: float = 0.0
    backend: dict[str, int] = field(default_factory=dict)
    out_dir: str = ""

    def line(self) -> str:
        b = self.backend
        return (f"trees: {self.done} done, {self.skipped} skipped, {len(self.failed)} failed | "
                f"leaves {self.leaves} ({self.successful_leaves} successful) | model calls {b.get('calls', 0)}, "
                f"samples {b.get('samples', 0)}, retries {b.get('retries', 0)} | env steps {self.env_steps} | "
                f"{self.wall_s:.1f}s -> {self.out_dir}")


def search_trees(indices: list[int], spec: EnvSpec, make_client: Callable[[], Any], backend: Backend,
                 settings: SearchSettings, on_tree: Callable[[Outcome], None] | None = None) -> DriverStats:
    """Search every task in ``indices`` with the one batch driver; ``on_tree``
    gets each tree's Outcome as it ends: ``job`` is its TreeSearch (idx,
    stats), ``result`` its root, or ``error`` when it failed."""
    settings.finish()
    cfg = DriverConfig(settings.sampling(), settings.max_token_length, settings.concurrency,
                       settings.env_retries, settings.env_retry_delay)

    return run_jobs((TreeSearch(i, spec, settings) for i in indices), backend, make_client, cfg,
                    on_tree or (lambda outcome: None))


def select_tasks(spec: EnvSpec, settings: SearchSettings, server: str) -> list[int]:
    """The training tasks this run covers; the server is identified and the
    test tasks of the split in use are never searched (agent_r.envs)."""
    chosen, where = spec.search_indices(settings, server)
    if not chosen:
        raise UsageError(f"no tasks to search: {where} select none; widen --min/--max (or --task_num/--task_iteration)")
    mine = shard_items(chosen, settings.shard)  # the whole list first, so every shard agrees on it
    line = describe_shard(settings.shard, len(mine), len(chosen))
    if line:
        log.info(line)
    return mine


def tree_done(path: Path) -> bool:
    """A finished tree (resume): a file that loads as a tree. A corrupt one is redone."""
    if not path.exists():
        return False
    try:
        load_tree(path)
        return True
    except TreeFormatError as exc:
        log.warning("redoing %s: %s", path.name, exc)
        return False


def collect_trees(settings: SearchSettings, backend: Backend | None = None) -> SearchSummary:
    """The whole of mcts_collection.py: select tasks, skip finished trees,
    search the rest, write each tree atomically as it ends, keep the manifest
    current, and return the summary. ``backend`` overrides the settings' one
    (library use); a backend made here is closed here."""
    settings.finish()
    spec, server = get_env(settings.task), settings.env_server_base or get_env(settings.task).default_server
    indices = select_tasks(spec, settings, server)
    out_dir = settings.out_dir()
    todo = [i for i in indices if not tree_done(out_dir / f"search_results_{i}.json")]
    log.info("%d tasks selected, %d already searched, %d to search", len(indices), len(indices) - len(todo), len(todo))
    summary = SearchSummary(skipped=len(indices) - len(todo), out_dir=str(out_dir))
    if not todo:
        return summary
    own = backend is None
    if own:
        backend = make_backend(settings.backend, seed=settings.seed,
                               max_model_len=settings.max_token_length + settings.max_new_tokens)
    try:
        _SearchRun(settings, spec, server, backend, summary, len(indices)).run(todo)
    finally:
        if own:
            backend.close()
    return summary


class _SearchRun:
    """Bookkeeping of one collect_trees call: tree files, manifest, progress."""

    def __init__(self, settings: SearchSettings, spec: EnvSpec, server: str, backend: Backend,
                 summary: SearchSummary, selected: int):
        self.settings, self.spec, self.server, self.backend, self.summary = settings, spec, server, backend, summary
        self.out_dir = Path(summary.out_dir)
        self.config = {**manifest_config(settings), "env_server_base": server, "model_name": settings.model_name(),
                       "indices": selected}
        self.items: dict[str, dict] = {}
        self.started = time.time()

    def run(self, todo: list[int]) -> None:
        make_client = lambda: self.spec.make_client(self.server, instruction_file=self.settings.backend.instruction_file)  # noqa: E731
        with tqdm(total=len(todo), desc=f"mcts {self.spec.name}", unit="tree") as self.progress:
            stats = search_trees(todo, self.spec, make_client, self.backend, self.settings, self.on_tree)
        self.summary.mean_batch = round(stats.mean_batch, 2)
        self.write_manifest(time.time())

    def on_tree(self, outcome: Outcome) -> None:
        tree, root, error = outcome.job, outcome.result, outcome.error
        stats = tree.stats.as_dict()
        if error is not None:
            self.summary.failed.append(tree.idx)
            log.error("task %s failed: %s", tree.idx, error)
            self.items[tree.key] = {**stats, "error": str(error)}
        else:
            atomic_write_json(self.out_dir / f"search_results_{tree.idx}.json", root.to_dict(), indent=2)
            self.summary.done += 1
            self.summary.leaves += tree.stats.leaves
            self.summary.successful_leaves += tree.stats.successful_leaves
            self.items[tree.key] = stats
        self.summary.env_steps += tree.stats.env_steps
        self.write_manifest(None)
        self.progress.update(1)

    def write_manifest(self, finished: float | None) -> None:
        self.summary.wall_s = round(time.time() - self.started, 2)
        self.summary.backend = self.backend.stats.as_dict()
        stats = {**asdict(self.summary), "failed": len(self.summary.failed)}
        write_manifest(self.out_dir / manifest_name(self.settings.shard), self.config, self.backend, stats,
                       self.started, finished, self.items)
