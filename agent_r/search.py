"""The whole mcts_collection.py run: which tasks to search, resume, the
search itself (batched across trees), tree files, the manifest, the summary
and the progress bar.

The MCTS of one task is agent_r/mcts.py. Here ``search_trees`` hands one
``TreeSearch`` job per task to the batch driver, which keeps up to
``concurrency`` trees in flight, answers the pending requests of ALL of them
with ONE ``backend.generate`` call and lets every tree do its env work at the
same time, each on its own env client. The reference searched one tree at a
time with one sample per call, so a GPU sat idle between tiny requests.

The model is loaded only when some selected tree is not on disk yet
(``llm.LazyBackend``), so a resumed run that is done loads none.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from tqdm import tqdm

from agent_r import paths
from agent_r.driver import DriverConfig, DriverStats, Outcome, run_jobs
from agent_r.envs import EnvSpec, get_env
from agent_r.io import atomic_write_json
from agent_r.llm import BUNDLED_MODEL, Backend, LazyBackend, SamplingConfig, check_backend, make_backend
from agent_r.manifest import write_manifest
from agent_r.model_identity import check_same_model, model_identity
from agent_r.knobs import (DEFAULT_TASK, BackendSettings, PromptBudget, SearchKnobs, ShardSettings, TaskChoice,
                           concurrency_setting, env_server_setting, max_new_tokens_setting, resolved_model_name,
                           seed_setting)
from agent_r.mcts import MCTSConfig, TreeSearch
from agent_r.settings import UsageError, manifest_config, nested, setting
from agent_r.sharding import describe as describe_shard, manifest_name, shard_items
from agent_r.tree import TreeFormatError, load_tree

log = logging.getLogger(__name__)


@dataclass
class SearchSettings(TaskChoice, PromptBudget, SearchKnobs):
    """Settings of mcts_collection.py; env var names are the reference's.
    TASK, MAX_TOKEN_LENGTH and the search knobs are declared in agent_r/knobs.py."""

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
    backend: BackendSettings = nested(BackendSettings)
    shard: ShardSettings = nested(ShardSettings)

    def finish(self) -> None:
        """Per-script and per-environment defaults (TASK, TEMP,
        MAX_TOKEN_LENGTH, then MAX_DEPTH once TASK is known); idempotent."""
        spec = get_env(self.task or DEFAULT_TASK)
        self.task = spec.name
        self.resolve_temperature()
        self.resolve_prompt_budget()
        if self.max_depth is None:
            self.max_depth = spec.max_depth

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, max_new_tokens=self.max_new_tokens)

    def model_name(self) -> str:
        return resolved_model_name(self.backend, BUNDLED_MODEL.name)

    def out_dir(self) -> Path:
        return Path(self.output_dir) / self.task / self.model_name()


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


def mcts_config(settings: SearchSettings) -> MCTSConfig:
    """What decides each tree besides the model (finishes the settings first:
    code-built ones work too)."""
    settings.finish()
    return MCTSConfig(iterations=settings.iterations, n_gen=settings.n_gen, max_depth=int(settings.max_depth),
                      seed=settings.seed, c=settings.c)


def search_trees(indices: list[int], spec: EnvSpec, make_client: Callable[[], Any], backend: Backend,
                 settings: SearchSettings, on_tree: Callable[[Outcome], None] | None = None,
                 clients: list[Any] | None = None) -> DriverStats:
    """Search every task in ``indices`` with the one batch driver; ``on_tree``
    gets each tree's Outcome as it ends: ``job`` is its TreeSearch (idx,
    stats), ``result`` its root, or ``error`` when it failed. ``clients``:
    env clients already open, used first and closed here."""
    config = mcts_config(settings)
    cfg = DriverConfig(settings.sampling(), settings.max_token_length, settings.concurrency,
                       settings.env_retries, settings.env_retry_delay)
    return run_jobs((TreeSearch(i, spec, config) for i in indices), backend, make_client, cfg,
                    on_tree or (lambda outcome: None), clients=clients)


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
        log.warning("searching the task of %s again, the file is unreadable: %s", path.name, exc)
        return False


def collect_trees(settings: SearchSettings, backend: Backend | None = None) -> SearchSummary:
    """The whole of mcts_collection.py: select tasks, skip finished trees,
    search the rest, write each tree atomically as it ends, keep the manifest
    current, and return the summary. ``backend`` overrides the settings' one
    (library use; the caller closes it); the settings' one is loaded only
    when a tree remains, and closed here."""
    settings.finish()
    spec = get_env(settings.task)
    server = settings.env_server_base or spec.default_server
    indices = select_tasks(spec, settings, server)
    out_dir = paths.tree_dir(settings)
    identity = model_identity(settings.backend)
    check_same_model(out_dir, identity, "trees")
    todo = [i for i in indices if not tree_done(paths.tree_file(out_dir, i))]
    log.info("%d tasks selected, %d already searched, %d to search", len(indices), len(indices) - len(todo), len(todo))
    summary = SearchSummary(skipped=len(indices) - len(todo), out_dir=str(out_dir))
    if not todo:
        return summary
    if backend is None:   # a model that cannot load fails here, before any tree is searched
        check_backend(settings.backend)
    lazy = LazyBackend(lambda: backend if backend is not None else make_backend(
        settings.backend, seed=settings.seed, max_model_len=settings.max_token_length + settings.max_new_tokens))
    try:
        _SearchRun(settings, spec, server, lazy, summary, len(indices), identity).run(todo)
    finally:
        if backend is None:
            lazy.close()
    return summary


class _SearchRun:
    """Bookkeeping of one collect_trees call: tree files, manifest, progress."""

    def __init__(self, settings: SearchSettings, spec: EnvSpec, server: str, backend: LazyBackend,
                 summary: SearchSummary, selected: int, identity: dict):
        self.settings, self.spec, self.server, self.backend, self.summary = settings, spec, server, backend, summary
        self.identity = identity
        self.out_dir = Path(summary.out_dir)
        self.config = {**manifest_config(settings), "env_server_base": server,
                       "model_name": paths.model_name(settings.backend), "indices": selected}
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
            atomic_write_json(paths.tree_file(self.out_dir, tree.idx), root.to_dict(), indent=2)
            self.summary.done += 1
            self.summary.leaves += tree.stats.leaves
            self.summary.successful_leaves += tree.stats.successful_leaves
            self.items[tree.key] = stats
        self.summary.env_steps += tree.stats.env_steps
        self.write_manifest(None)
        self.progress.update(1)

    def write_manifest(self, finished: float | None) -> None:
        """The manifest so far; the model is described once it is loaded."""
        self.summary.wall_s = round(time.time() - self.started, 2)
        loaded = self.backend.get() if self.backend.loaded else None
        self.summary.backend = loaded.stats.as_dict() if loaded is not None else {}
        stats = {**asdict(self.summary), "failed": len(self.summary.failed)}
        write_manifest(paths.manifest_file(self.out_dir, manifest_name(self.settings.shard)), self.config, loaded,
                       stats, self.started, finished, self.items, self.identity)
