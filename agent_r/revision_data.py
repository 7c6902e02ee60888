"""The path-collection run behind ``path_collection.py``: search trees in, one
JSONL of revision (or good-only) rows out, with its manifest and a summary.

Why a part file per tree: the verifier is the costly step (one prompt per
distinct low-path step) and a long run gets killed. Each finished tree's
result is kept in the part cache (``{output_dir}/.parts/{TASK}_{data_type}/{idx}.json``,
agent_r.paths) with a fingerprint (the tree file's hash, the settings that decide its rows, the
verifier's identity). A rerun reuses every part whose fingerprint matches,
redoes the rest and rewrites the JSONL whole from all parts in task order: the
same input gives the same bytes and never duplicate rows, and changing a
setting or a tree redoes just what it touches.

Why trees are batched: the verifier prompts of ``tree_batch`` trees share one
model call (agent_r.verifier explains why that equals a step-by-step walk),
and model calls are the run's wall time. The verifier model is loaded only
when some tree still needs judging (``llm.LazyBackend``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from agent_r import paths, revision
from agent_r.envs import get_env
from agent_r.io import atomic_write_json, atomic_write_jsonl, file_sha256, read_json
from agent_r.knobs import (VERIFIER_TEMPERATURE, BackendSettings, PairKnobs, PromptBudget, ShardSettings, TaskChoice,
                           Temperature, max_new_tokens_setting, resolved_model_name)
from agent_r.llm import BUNDLED_MODEL, Backend, LazyBackend, make_backend
from agent_r.manifest import load_manifest, write_manifest
from agent_r.model_identity import recorded_identity, same_model, shown_model
from agent_r.revision import RevisionConfig, TreeRows
from agent_r.sharding import describe as describe_shard, shard_items, shard_position
from agent_r.settings import EXIT_ITEMS_FAILED, EXIT_OK, UsageError, manifest_config, nested, setting, validate
from agent_r.tree import TreeFormatError, load_tree

log = logging.getLogger(__name__)

@dataclass
class PathSettings(TaskChoice, PromptBudget, PairKnobs, Temperature):
    """Every setting of ``path_collection.py`` (flag > env var > default).
    TASK (required), ALPHA, BETA, the pair cap, TEMP and MAX_TOKEN_LENGTH (the
    verifier's prompt budget) are declared in agent_r/knobs.py."""

    input_dir: str | None = setting(None, help="the folder of search_results_<idx>.json trees (default "
                                               "mcts_result/{TASK}/{model name})")
    output_dir: str = setting("mcts_training_data", help="where {TASK}_{data_type}.jsonl goes "
                                                         "(default mcts_training_data)")
    data_type: str = setting("centric", choices=("centric", "good"),
                             help="the kind of rows: centric = revision pairs, good = good paths only "
                                  "(default centric)")
    revise: bool = setting(True, help="whether the model finds the first bad step (1) or the whole low path "
                                      "is the bad prefix (0) (default 1)")
    seed: int = setting(0, help="the seed of pair shuffling, revision thoughts and verifier requests (default 0)")
    verifier_temperature: float | None = setting(None, minimum=0.0, help="the verifier's sampling temperature "
                                                 "(default: TEMP when set, else 0 = greedy)")
    max_new_tokens: int = max_new_tokens_setting("a verifier reply")
    tree_batch: int = setting(32, minimum=1, help="trees whose verifier prompts share one batched model call "
                                                  "(default 32)")
    backend: BackendSettings = nested(BackendSettings)
    shard: ShardSettings = nested(ShardSettings)

    def finish(self) -> None:
        """Per-task defaults, the verifier's temperature and prompt budget,
        and the default input folder (idempotent)."""
        if self.verifier_temperature is None:
            self.verifier_temperature = VERIFIER_TEMPERATURE if self.temperature is None else self.temperature
        self.resolve_prompt_budget()
        if not self.task:
            raise UsageError("environment variable TASK is not set: it is the environment the trees come from "
                             "(textcraft, sciworld or webshop). Set it, e.g. `export TASK=textcraft`.")
        spec = get_env(self.task)
        self.task = spec.name
        self.alpha = spec.alpha if self.alpha is None else self.alpha
        self.beta = spec.beta if self.beta is None else self.beta
        if self.input_dir is None:
            model = resolved_model_name(self.backend, BUNDLED_MODEL.name)
            self.input_dir = str(Path("mcts_result") / self.task / model)

    def revision_config(self) -> RevisionConfig:
        """The settings that decide a tree's rows, built in this one place so
        each has one default (finishes the settings first: code-built ones
        work too)."""
        self.finish()
        return RevisionConfig(
            alpha=float(self.alpha), beta=float(self.beta), data_type=self.data_type, revise=bool(self.revise),
            seed=self.seed, max_pairs_per_tree=self.max_pairs_per_tree,
            verifier_temperature=float(self.verifier_temperature), max_new_tokens=self.max_new_tokens,
            max_token_length=self.max_token_length)

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir) / f"{self.task}_{self.data_type}.jsonl"


# --------------------------------------------------------------------------- trees and parts

def find_trees(settings: PathSettings) -> list[tuple[int, Path]]:
    """(index, path) of the trees to read, in index order, from the folder
    ``paths.revision_input`` picks (UsageError when there is none)."""
    return paths.tree_files(paths.revision_input(settings))


class PartCache:
    """Per-tree results of one (TASK, data_type), each valid for one fingerprint."""

    def __init__(self, settings: PathSettings, cfg: RevisionConfig) -> None:
        self.folder = paths.parts_dir(settings)
        verifier = [settings.backend.backend, settings.backend.model_dir] if cfg.needs_verifier else None
        self.base = {"config": dataclasses.asdict(cfg), "verifier": verifier}

    def fingerprint(self, tree: Path) -> dict:
        return self.base | {"tree_sha256": file_sha256(tree)}

    def load(self, idx: int, fingerprint: dict) -> TreeRows | None:
        """The cached result, if it was made from the same tree and settings."""
        path = paths.part_file(self.folder, idx)
        if not path.exists():
            return None
        try:
            part = read_json(path)
            if not isinstance(part, dict) or part.get("fingerprint") != fingerprint:
                return None
            return TreeRows.from_dict(part["result"])
        except (ValueError, TypeError, KeyError):  # unreadable or another shape: redo the tree
            return None

    def save(self, idx: int, fingerprint: dict, rows: TreeRows) -> None:
        atomic_write_json(paths.part_file(self.folder, idx), {"fingerprint": fingerprint, "result": rows.to_dict()},
                          indent=None)


# --------------------------------------------------------------------------- whose rows

def trees_source(folder: Path, trees: list[tuple[int, Path]]) -> dict:
    """The trees a JSONL's rows come from: their folder, the model that
    searched them, and one digest of their files (the same trees copied
    elsewhere are the same source)."""
    digest = hashlib.sha256("".join(f"{idx}:{file_sha256(path)}\n" for idx, path in trees).encode()).hexdigest()
    return {"folder": str(folder), "model": recorded_identity(folder), "trees_sha256": digest}


def check_rows_source(settings: PathSettings, new: dict) -> None:
    """A JSONL holding rows made from other trees (another model's, or another
    folder's: the previous iteration of the step-by-step pipeline) is never
    overwritten: a UsageError names both sources and the way out. The same
    folder searched further, or the same trees read from elsewhere, are the
    same source."""
    output = paths.revision_file(settings)
    old = (load_manifest(paths.revision_manifest(output)).get("stats") or {}).get("trees_from")
    if not output.exists() or not isinstance(old, dict) or not old.get("folder"):
        return
    same_folder = Path(old["folder"]).resolve() == Path(new["folder"]).resolve()
    if same_folder and (not old.get("model") or not new["model"] or same_model(old["model"], new["model"])):
        return
    if old.get("trees_sha256") == new["trees_sha256"]:
        return
    was = f"{old['folder']}" + (f", searched by {shown_model(old['model'])}" if old.get("model") else "")
    now = f"{new['folder']}" + (f", searched by {shown_model(new['model'])}" if new["model"] else "")
    raise UsageError(f"{output} holds rows made from the trees in {was}; this run reads the trees in {now}: pass "
                     f"--output_dir to keep both (e.g. --output_dir {Path(settings.output_dir) / Path(new['folder']).name}), "
                     "or move the old file away first")


# --------------------------------------------------------------------------- the run

@dataclass
class CollectResult:
    """What a run produced; ``report()`` is the summary the script prints."""

    settings: PathSettings
    trees: list[int]                                  # every tree index read, in order
    results: dict[int, TreeRows]                      # tree index -> its rows (failed trees absent)
    source: dict = field(default_factory=dict)        # trees_source() of the folder read
    failed: list[str] = field(default_factory=list)   # tree files that could not be read
    verifier_prompts_this_run: int = 0
    rows: int = 0
    backend_stats: dict = field(default_factory=dict)  # empty when no model was used

    @property
    def output(self) -> Path:
        return paths.revision_file(self.settings)

    @property
    def exit_code(self) -> int:
        """The scripts' rule: 1 when a tree failed (fix it and rerun), else 0."""
        return EXIT_ITEMS_FAILED if self.failed else EXIT_OK

    @property
    def problem(self) -> str | None:
        if not self.failed:
            return None
        return (f"error: {len(self.failed)} tree(s) could not be read: {', '.join(self.failed)} "
                "(fix or delete them, or rerun mcts_collection.py for those tasks)")

    def report(self) -> str:
        done = [self.results[idx] for idx in self.trees if idx in self.results]
        total = lambda key: sum(getattr(r, key) for r in done)  # noqa: E731
        hist: Counter = Counter()
        for r in done:
            hist.update(r.first_bad)
        lines = [
            f"trees read: {len(self.trees)}  skipped (no success): {sum(r.skipped for r in done)}  "
            f"failed: {len(self.failed)}",
            f"pairs: {total('pairs')}  revision samples: {total('revision_samples')}  "
            f"good samples: {total('good_samples')}  pairs without good suffix (dropped): "
            f"{total('empty_suffix_pairs')}",
            f"verifier calls (prompts): {total('verifier_prompts')} ({self.verifier_prompts_this_run} this run)  "
            f"unparseable judgements: {total('unparseable')}",
            f"first bad step (position:paths): {revision.histogram(hist)}",
            f"wrote {self.rows} rows to {self.output}",
        ]
        if self.backend_stats:
            lines.append(f"model calls {self.backend_stats['calls']}, retries {self.backend_stats['retries']}")
        return "\n".join(lines)


def collect(settings: PathSettings, backend: Backend | None = None) -> CollectResult:
    """Run path collection as ``settings`` say, resuming from the part cache.

    ``backend`` is a ready verifier (a test double, or a caller's already
    loaded model; the caller closes it); without it one is made from
    ``settings.backend`` when some tree still needs judging, and closed here.
    Raises UsageError for a missing/empty input folder; unreadable trees are
    logged, skipped and listed in the result (exit code 1)."""
    validate(settings)
    cfg = settings.revision_config()
    trees = find_trees(settings)
    folder = trees[0][1].parent
    source = trees_source(folder, trees)
    check_rows_source(settings, source)
    everything, trees = len(trees), shard_items(trees, settings.shard)
    line = describe_shard(settings.shard, len(trees), everything)
    if line:   # a shard judges its trees into the part cache; the unsharded pass after writes the rows
        log.info(line)
    cache = PartCache(settings, cfg)
    result = CollectResult(settings, [idx for idx, _ in trees], {}, source=source)
    todo = []
    for idx, path in trees:
        fingerprint = cache.fingerprint(path)
        cached = cache.load(idx, fingerprint)
        if cached is None:
            todo.append((idx, path, fingerprint))
        else:
            result.results[idx] = cached
    log.info("%d trees in %s, %d already processed", len(trees), folder, len(trees) - len(todo))
    verifier = LazyBackend(lambda: backend if backend is not None else make_backend(
        settings.backend, seed=settings.seed, max_model_len=settings.max_token_length + settings.max_new_tokens))
    started = time.time()
    try:
        with tqdm(total=len(todo), desc="trees", unit="tree") as bar:
            for start in range(0, len(todo), settings.tree_batch):
                batch = todo[start:start + settings.tree_batch]
                result.verifier_prompts_this_run += _run_batch(batch, cfg, verifier, cache, result)
                bar.update(len(batch))
        used = verifier.get() if verifier.loaded else None
        if used is not None:
            result.backend_stats = used.stats.as_dict()
        if shard_position(settings.shard)[1] == 1:
            _write_outputs(result, used, started)
    finally:
        if backend is None:
            verifier.close()
    return result


def _run_batch(batch: list[tuple[int, Path, dict]], cfg: RevisionConfig, verifier: LazyBackend, cache: PartCache,
               result: CollectResult) -> int:
    """Plan, verify (one model call for the whole batch) and save each tree's
    part; returns the verifier prompts sent."""
    plans, fingerprints = [], []
    for idx, path, fingerprint in batch:
        try:
            plan = revision.plan_tree(idx, load_tree(path), cfg)
        except TreeFormatError as exc:
            log.error("skipping %s: %s; to use its task, delete the file, rerun mcts_collection.py (it searches "
                      "that task again) and then this", path.name, exc)
            result.failed.append(path.name)
            continue
        if plan is None:
            result.results[idx] = TreeRows(skipped=True)
            cache.save(idx, fingerprint, result.results[idx])
            continue
        plans.append(plan)
        fingerprints.append(fingerprint)
    if not plans:
        return 0
    needs_model = cfg.needs_verifier and any(p.low_paths for p in plans)
    done = revision.process_trees(plans, cfg, verifier if needs_model else None)
    for plan, fingerprint, rows in zip(plans, fingerprints, done):
        cache.save(plan.idx, fingerprint, rows)
        result.results[plan.idx] = rows
    return sum(rows.verifier_prompts for rows in done)


def _write_outputs(result: CollectResult, backend: Backend | None, started: float) -> None:
    """The JSONL (whole, from every part, in task order) and its manifest."""
    rows = [row for idx in result.trees if idx in result.results for row in result.results[idx].rows]
    atomic_write_jsonl(result.output, rows)
    result.rows = len(rows)
    stats = {"trees": len(result.trees), "trees_from": result.source, "failed": result.failed, "rows": len(rows),
             "verifier_prompts_this_run": result.verifier_prompts_this_run, "backend": result.backend_stats}
    write_manifest(paths.revision_manifest(result.output),
                   manifest_config(result.settings), backend, stats, started, time.time())
