"""The whole eval.py run: which test tasks to play, resume, the episodes
(agent_r/episode.py) batched by the one driver, result files, the manifest
and the summary. Reading finished runs (summary, loop statistic, --compare)
is agent_r/report.py.

Why the shape below:
* Each task is an ``Episode`` job for the one batch driver (agent_r/driver.py):
  episodes run side by side, and every step all episodes waiting for a turn
  share ONE ``backend.generate`` call. Model calls dominate wall time, so
  batching them is the speed-up. Retries, fatal errors and client clean-up
  are the driver's rules, the same as the search's.
* The model is loaded only when an episode asks for a turn
  (``llm.LazyBackend``): a resumed run that is done loads none, and one env
  client is opened first, so an unreachable server fails before any load.
* The summary is always recomputed from every result file in the run
  directory, so "interrupted + resumed" reports exactly what an uninterrupted
  run reports.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from tqdm import tqdm

from agent_r import conversation as conv
from agent_r import paths, provenance
from agent_r.driver import DriverConfig, Outcome, close_quietly, env_errors, is_fatal, run_jobs
from agent_r.envs import EnvSpec, get_env
from agent_r.episode import Episode, EpisodeSetup, Task
from agent_r.io import atomic_write_json, read_json
from agent_r.knobs import (EVAL_PROMPT_BUDGET, BackendSettings, PromptBudget, ShardSettings, TaskChoice, Temperature,
                           WaitReply, EvalSamples, concurrency_setting, env_server_setting, max_new_tokens_setting,
                           resolved_model_name, seed_setting)
from agent_r.llm import (BUNDLED_MODEL, Backend, BackendStats, LazyBackend, SamplingConfig, check_backend,
                         make_backend, weights_sha256)
from agent_r.manifest import load_manifest, write_manifest
from agent_r.model_identity import check_same_model, model_identity
from agent_r.report import summarize_dir
from agent_r.sharding import describe as describe_shard, manifest_name, shard_items
from agent_r.settings import EXIT_ITEMS_FAILED, EXIT_OK, UsageError, manifest_config, nested, setting, validate

log = logging.getLogger(__name__)

TASK_HELP = "the environment to evaluate: textcraft, sciworld or webshop"


@dataclass
class EvalSettings(TaskChoice, PromptBudget, Temperature, WaitReply, EvalSamples):
    """Every setting of eval.py (flag > env var > default; see --help). TASK
    (required, except with --compare), TEMP, MAX_TOKEN_LENGTH and WAIT_REPLY
    are declared in agent_r/knobs.py."""

    model_type: str = setting("eval", env="MODEL_TYPE", flag=None,
                              help="the label appended to the output folder, e.g. iter1 (default eval)")
    env_server_base: str | None = env_server_setting()
    max_steps: int = setting(100, minimum=1, help="the most model turns per episode (default 100)")
    split: str | None = setting(None, help="the named split whose test list is evaluated: agenteval (the paper's "
                                "lists) or project (default: agenteval where its ids mean the paper's tasks on the "
                                "server in use, see docs/environments.md)")
    split_file: str | None = setting(None, help="a task list to evaluate instead of the split's test list "
                                     "(AgentGym's [{\"item_id\": ...}] or the release's {\"<id>\": n})")
    output_dir: str = setting("test_result", help="the root folder of the results (default test_result)")
    concurrency: int = concurrency_setting("episodes played")
    seed: int = seed_setting()
    max_new_tokens: int = max_new_tokens_setting()
    limit: int | None = setting(None, minimum=1, help="the number of tasks to evaluate: the first N of the split "
                                "or of the --revise_from rows (default: all)")
    compare: list[str] | None = setting(None, help="print the summaries of these finished run folders side by "
                                        "side and exit; runs nothing")
    plot: str | None = setting(None, help="with --compare: also write a PNG of the runs' success and loop "
                               "statistics to this file")
    revise_from: str | None = setting(None, help="a JSONL file of failed trajectories to continue (the revision "
                                      "task)")
    env_retries: int = setting(2, minimum=0, help="the fresh-env restarts of an episode after env errors "
                               "before it is recorded as failed (default 2)")
    env_retry_delay: float = setting(1.0, minimum=0.0, help="the seconds before the first restart, doubled for each "
                                     "next one: time for a restarted server to come back (default 1.0)")
    backend: BackendSettings = nested(BackendSettings)
    shard: ShardSettings = nested(ShardSettings)

    def finish(self) -> None:
        """TASK is required unless the run only compares finished folders;
        TEMP and MAX_TOKEN_LENGTH fall back to eval's defaults (idempotent)."""
        self.resolve_temperature()
        self.resolve_prompt_budget(EVAL_PROMPT_BUDGET)
        if self.plot and not self.compare:
            raise UsageError("--plot draws the runs of --compare: pass --compare RUN_DIR... with it")
        if self.compare:
            return
        if self.eval_samples > 1 and self.temperature == 0:
            k = self.eval_samples
            raise UsageError(f"--samples {k} asks for {k} episodes of each task, but TEMP=0 "
                             "is greedy and would play the same episode each time: set TEMP > 0 (e.g. TEMP=1.0) "
                             "or drop --samples")
        if not (self.task and self.task.strip()):
            raise UsageError(f"environment variable TASK is not set: it is {TASK_HELP}. "
                             "Set it, e.g. `export TASK=textcraft`.")
        get_env(self.task)

    @property
    def model_name(self) -> str:
        return resolved_model_name(self.backend, BUNDLED_MODEL.name)

    def run_dir(self) -> Path:
        """The run's output folder (agent_r.paths.eval_dir, its one rule)."""
        return paths.eval_dir(self)

    def run_config(self) -> dict[str, Any]:
        """The manifest's and summary's "config": every setting, secrets
        masked, plus the resolved model name the output folder uses. A
        one-episode run leaves ``eval_samples`` out, so its files are the ones
        eval.py wrote before sampling existed."""
        config = {**manifest_config(self), "model_name": self.model_name}
        if self.eval_samples == 1:
            del config["eval_samples"]
        return config


# ---------------------------------------------------------------------------
# What to run
# ---------------------------------------------------------------------------

class Plan(NamedTuple):
    spec: EnvSpec
    tasks: list[Task]                   # every episode the run covers (K per task with --samples K)
    todo: list[Task]                    # without a complete result file yet


def split_tasks(spec: EnvSpec, split_file: str | None, limit: int | None, split: str | None = None,
                server: str | None = None) -> list[Task]:
    """The test tasks: --split_file, else the split's list for the server at
    ``server`` (identified only then)."""
    indices = spec.split_indices("test", split_file, split=split, server=server)
    log.info("eval tasks: %d of the %d test tasks of %s", len(indices[:limit]), len(indices), split_file or split
             or "the default split")
    return [Task(idx, str(idx)) for idx in indices[:limit]]


def load_revise_tasks(path: str, limit: int | None = None) -> list[Task]:
    """Failed prefixes from path_collection JSONL (``low_log``) or any JSONL of
    ``{task_num, messages}``. One episode per row; several rows of one task
    become keys ``<task>_0``, ``<task>_1``, ..."""
    if not os.path.exists(path):
        raise UsageError(f"--revise_from {path} does not exist; pass a path_collection JSONL file")
    tasks: list[Task] = []
    seen: dict[int, int] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                idx, turns = _revise_row(path, line_no, line)
                tasks.append(Task(idx, f"{idx}_{seen.get(idx, 0)}", turns))
                seen[idx] = seen.get(idx, 0) + 1
    if not tasks:
        raise UsageError(f"--revise_from {path} has no rows")
    return tasks[:limit]


def _revise_row(path: str, line_no: int, line: str) -> tuple[int, tuple[str, ...]]:
    try:
        row = json.loads(line)
        idx = int(row["task_num"])
        messages = row.get("low_log") or row.get("messages")
        if not isinstance(messages, list):
            raise KeyError("low_log")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--revise_from {path}, line {line_no}: expected a JSON object with task_num and "
                         f"low_log (or messages) ({type(exc).__name__}: {exc})") from None
    return idx, tuple(m["content"] for m in messages[conv.HEAD_LEN:] if m.get("role") == "assistant")


def is_complete(path: Path) -> bool:
    """A finished result: valid JSON with the required keys, not an env error
    (errors are retried on the next run, they may have been transient)."""
    if not path.exists():
        return False
    try:
        data = read_json(path)
    except (ValueError, OSError) as exc:
        log.warning("%s; redoing it", exc)
        return False
    if not (isinstance(data, dict) and all(k in data for k in ("task_id", "env_score", "step_num", "state"))):
        log.warning("%s lacks result keys; redoing it", path)
        return False
    return data.get("ended_by") != "error"


def plan(settings: EvalSettings) -> Plan:
    """What the run covers and what is left (resume). Validates TASK, the
    split and the revise file before anything expensive starts."""
    spec = get_env(settings.task or "")
    if settings.revise_from:
        tasks = load_revise_tasks(settings.revise_from, settings.limit)
    else:
        tasks = split_tasks(spec, settings.split_file, settings.limit, settings.split,
                            settings.env_server_base or spec.default_server)
    everything, tasks = len(tasks), shard_items(tasks, settings.shard)  # every shard agrees on the whole list
    line = describe_shard(settings.shard, len(tasks), everything)
    if line:
        log.info(line)
    if settings.eval_samples > 1:   # a task's episodes side by side: one batch shares their prompt (prefix cache)
        tasks = [t.sampled(j) for t in tasks for j in range(settings.eval_samples)]
    run_dir = paths.eval_dir(settings)
    check_same_model(run_dir, model_identity(settings.backend), "eval results")
    return Plan(spec, tasks, [t for t in tasks if not is_complete(paths.result_file(run_dir, t.key))])


# ---------------------------------------------------------------------------
# A whole run
# ---------------------------------------------------------------------------

@dataclass
class EvalRun:
    """What one invocation did; ``summary`` is what summary.json holds."""

    run_dir: Path
    summary: dict[str, Any]
    ran: int = 0          # episodes this invocation played (finished or failed)
    failed: int = 0       # of those, ended by an env error after retries: a rerun retries them
    skipped: int = 0      # complete from an earlier invocation

    @property
    def exit_code(self) -> int:
        return EXIT_ITEMS_FAILED if self.failed else EXIT_OK


class _Recorder:
    """Writes each finished episode's file as it ends (so a kill loses only
    episodes in flight) and keeps the manifest's per-task items."""

    def __init__(self, run_dir: Path, progress: tqdm, save_manifest: Callable[[dict[str, Any]], None]):
        self.run_dir, self.progress, self.save_manifest = run_dir, progress, save_manifest
        self.items: dict[str, Any] = {}
        self.failed = 0

    def __call__(self, outcome: Outcome) -> None:
        episode: Episode = outcome.job
        if outcome.error is not None:
            if is_fatal(outcome.error):
                return   # the run stops; the task has no file and the rerun redoes it
            bug = not isinstance(outcome.error, env_errors())   # keep its traceback
            log.warning("task %s failed for good: %s", episode.key, outcome.error,
                        exc_info=outcome.error if bug else None)
            self.failed += 1
            result = episode.failed(outcome.error)
        else:
            result = outcome.result
        atomic_write_json(paths.result_file(self.run_dir, episode.key), result)
        self.items[episode.key] = {"env_score": result["env_score"], "step_num": result["step_num"],
                                   "ended_by": result["ended_by"], "env_restarts": outcome.restarts}
        # The manifest after every episode, not only at the end: a folder banked
        # while its eval runs, whose machine then goes, still names that machine.
        self.save_manifest(self.items)
        self.progress.update(1)


def evaluate(settings: EvalSettings, backend: Backend | None, new_client: Callable[[], Any] | None = None,
             clients: list[Any] | None = None, planned: Plan | None = None, root: Path | None = None) -> EvalRun:
    """Run the episodes still missing in the run directory with ``backend``
    (a ready one, or a ``LazyBackend`` loaded at the first model turn), then
    write and return the run's summary (library use: tests, benches, the loop).

    ``clients`` are already-open env clients to reuse; they are closed here.
    ``new_client`` replaces the task's client factory (tests wrap it).
    ``root``: the folder of the run this eval belongs to (the loop's), which
    the summary's paths are written relative to (``paths.portable``)."""
    validate(settings)
    settings.finish()
    planned = planned if planned is not None else plan(settings)
    run_dir = paths.eval_dir(settings)
    run_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    if planned.todo:
        if backend is None:
            raise ValueError("a backend is needed when tasks remain")
        failed = _run_todo(settings, backend, planned, new_client, clients)
    else:
        for client in clients or []:
            close_quietly(client)
    summary = _write_summary(settings, planned, run_dir, backend, root)
    return EvalRun(run_dir, summary, ran=len(planned.todo), failed=failed,
                   skipped=len(planned.tasks) - len(planned.todo))


def _loaded(backend: Backend | None) -> Backend | None:
    """The backend if it was made: a LazyBackend's model once loaded, any other as given."""
    if isinstance(backend, LazyBackend):
        return backend.get() if backend.loaded else None
    return backend


def _run_todo(settings: EvalSettings, backend: Backend, planned: Plan, new_client: Callable[[], Any] | None,
              clients: list[Any] | None) -> int:
    """Play ``planned.todo``; returns how many failed for good. The manifest
    is written also when interrupted (``finished`` stays null then)."""
    spec, run_dir = planned.spec, paths.eval_dir(settings)
    setup = EpisodeSetup(spec, settings.model_name, settings.max_steps, settings.seed, settings.wait_reply)
    new_client = new_client or (lambda: spec.make_client(settings.env_server_base,
                                                         instruction_file=settings.backend.instruction_file))
    cfg = DriverConfig(SamplingConfig(temperature=settings.temperature, max_new_tokens=settings.max_new_tokens),
                       settings.max_token_length, settings.concurrency, settings.env_retries,
                       settings.env_retry_delay)
    started, identity = time.time(), model_identity(settings.backend)

    def save_manifest(items: dict[str, Any], finished: float | None = None) -> None:
        used = _loaded(backend)
        write_manifest(paths.manifest_file(run_dir, manifest_name(settings.shard)), settings.run_config(), used,
                       (used.stats if used is not None else BackendStats()).as_dict(), started, finished,
                       items, identity)

    with tqdm(total=len(planned.todo), desc=f"eval {spec.name}", unit="task") as bar:
        record, finished = _Recorder(run_dir, bar, save_manifest), None
        try:
            run_jobs([Episode(t, setup) for t in planned.todo], backend, new_client, cfg, record, clients=clients)
            finished = time.time()
        finally:
            save_manifest(record.items, finished)
    return record.failed


def _write_summary(settings: EvalSettings, planned: Plan, run_dir: Path, backend: Backend | None,
                   root: Path | None = None) -> dict[str, Any]:
    """summary.json from every result file of the run folder, with the model
    (and its weights' sha256) and its calls when this invocation had work for
    one; paths relative to ``root`` or the repository (``paths.portable``)."""
    summary = summarize_dir(run_dir, planned.spec)
    summary["mode"] = "revise" if settings.revise_from else "test"
    summary["wait_reply"] = settings.wait_reply
    summary["config"] = settings.run_config()
    used = _loaded(backend)
    if used is not None:
        summary["backend"] = used.describe()
        summary["backend_stats"] = used.stats.as_dict()
    elif backend is not None and planned.todo:      # episodes ran but none reached the model
        summary["backend_stats"] = BackendStats().as_dict()
    sha = weights_sha256(settings.backend.model_dir)
    if sha:
        summary["model_sha256"] = sha
    if used is None:   # a resumed run with nothing left: what earlier invocations recorded stays
        summary = {**provenance.recorded_backend(run_dir, manifest_name(settings.shard)), **summary}
    summary["provenance"] = provenance.of_summary(settings, summary, provenance.earlier(run_dir), bool(planned.todo))
    summary = paths.portable_paths(summary, root)
    _complete_manifest(run_dir, settings, {t.key for t in planned.tasks})
    atomic_write_json(paths.summary_file(run_dir), summary)
    return summary


def _complete_manifest(run_dir: Path, settings: EvalSettings, keys: set[str]) -> None:
    """Every episode file of this run's ``keys`` (a shard's own) has its item
    in the manifest: an invocation killed after an episode ended but before
    its manifest was written leaves one out, read back from the episode file
    (``recovered``)."""
    path = paths.manifest_file(run_dir, manifest_name(settings.shard))
    manifest = load_manifest(path)
    if not manifest:
        return
    items = manifest.get("items") if isinstance(manifest.get("items"), dict) else {}
    missing = {}
    for file in paths.result_files(run_dir):
        key = file.stem[len(paths.RESULT_PREFIX):]
        if key in items or key not in keys:
            continue
        try:
            result = read_json(file)
        except ValueError:
            continue
        missing[key] = {"env_score": result.get("env_score"), "step_num": result.get("step_num"),
                        "ended_by": result.get("ended_by"), "recovered": True}
    if missing:
        manifest["items"] = dict(sorted({**items, **missing}.items(), key=lambda kv: (len(kv[0]), kv[0])))
        atomic_write_json(path, manifest, indent=2)


def run(settings: EvalSettings) -> EvalRun:
    """eval.py's whole job: plan (resume), open one env client first so an
    unreachable server fails in seconds instead of after loading the model,
    play the missing episodes (the model loads at the first turn), write
    results, manifest and summary. When nothing is left, neither the model
    nor the server is needed."""
    validate(settings)
    settings.finish()
    planned = plan(settings)
    if planned.todo:   # a model that cannot load fails here, before any folder is made
        check_backend(settings.backend)
    log.info("%d tasks, %d already done in %s", len(planned.tasks), len(planned.tasks) - len(planned.todo),
             paths.eval_dir(settings))
    backend = LazyBackend(lambda: make_backend(settings.backend, seed=settings.seed,
                                               max_model_len=settings.max_token_length + settings.max_new_tokens))
    clients: list[Any] = []
    try:
        if planned.todo:
            clients.append(planned.spec.make_client(settings.env_server_base,
                                                    instruction_file=settings.backend.instruction_file))
        return evaluate(settings, backend, clients=clients, planned=planned)
    finally:
        for client in clients:
            close_quietly(client)   # already closed by the driver; closing is idempotent
        backend.close()
