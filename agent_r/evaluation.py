"""Evaluation: run the policy on held-out tasks and write one result per task
(SPEC section 5, plus the revision task). Reading finished runs (summary,
loop statistic, --compare) is agent_r/report.py.

Why the shape below:
* Each task is an ``Episode`` job for the one batch driver (agent_r/driver.py):
  episodes run side by side, and every step all episodes waiting for a turn
  share ONE ``backend.generate`` call. Model calls dominate wall time, so
  batching them is the speed-up. Retries, fatal errors and client clean-up
  are the driver's rules, the same as the search's.
* Each request carries a seed derived from (seed, task, model step), so a
  deterministic backend gives the same trajectories at any concurrency, after
  an env restart and after a resume.
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
from typing import Any, Callable, Generator, NamedTuple

from tqdm import tqdm

from agent_r import conversation as conv
from agent_r.driver import DriverConfig, Outcome, close_quietly, env_errors, is_fatal, run_jobs
from agent_r.envs import EnvSpec, get_env
from agent_r.io import atomic_write_json, read_json
from agent_r.knobs import EVAL_PROMPT_BUDGET, PromptBudget, TaskChoice, Temperature
from agent_r.llm import BUNDLED_MODEL, Backend, GenerationRequest, SamplingConfig, derive_seed, make_backend
from agent_r.manifest import write_manifest
from agent_r.report import SUMMARY_FILE, result_path, summarize_dir
from agent_r.settings import ShardSettings
from agent_r.sharding import describe as describe_shard, manifest_name, shard_items
from agent_r.settings import (EXIT_ITEMS_FAILED, EXIT_OK, BackendSettings, UsageError, concurrency_setting,
                              env_server_setting, manifest_config, max_new_tokens_setting,
                              nested, resolved_model_name, seed_setting, setting, validate)

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
TASK_HELP = "the environment to evaluate: textcraft, sciworld or webshop"


@dataclass
class EvalSettings(TaskChoice, PromptBudget, Temperature):
    """Every setting of eval.py (flag > env var > default; see --help). TASK
    (required, except with --compare), TEMP and MAX_TOKEN_LENGTH are declared
    in agent_r/knobs.py."""

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
        if not (self.task and self.task.strip()):
            raise UsageError(f"environment variable TASK is not set: it is {TASK_HELP}. "
                             "Set it, e.g. `export TASK=textcraft`.")
        get_env(self.task)

    @property
    def model_name(self) -> str:
        return resolved_model_name(self.backend, BUNDLED_MODEL.name)

    def run_dir(self) -> Path:
        suffix = "_revise" if self.revise_from else ""
        return Path(self.output_dir) / get_env(self.task).name / f"{self.model_name}_{self.model_type}{suffix}"

    def run_config(self) -> dict[str, Any]:
        """The manifest's and summary's "config": every setting, secrets
        masked, plus the resolved model name the output folder uses."""
        return {**manifest_config(self), "model_name": self.model_name}


# ---------------------------------------------------------------------------
# What to run
# ---------------------------------------------------------------------------

class Task(NamedTuple):
    """One episode to run: a task index, optionally a failed prefix to replay."""

    idx: int
    key: str                            # result file key: "12", or "12_0" for a revise row
    prefix_turns: tuple[str, ...] = ()


class Plan(NamedTuple):
    spec: EnvSpec
    tasks: list[Task]                   # everything the run covers
    todo: list[Task]                    # without a complete result file yet


def split_tasks(spec: EnvSpec, split_file: str | None, limit: int | None, split: str | None = None,
                server: str | None = None) -> list[Task]:
    """The test tasks: --split_file, else the split's list for the server at
    ``server`` (identified only then)."""
    indices = spec.split_indices("test", split_file, split=split, server=server)
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
    run_dir = settings.run_dir()
    return Plan(spec, tasks, [t for t in tasks if not is_complete(result_path(run_dir, t.key))])


# ---------------------------------------------------------------------------
# One episode
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class EpisodeSetup:
    """What every episode of a run shares."""

    spec: EnvSpec
    model_name: str
    max_steps: int
    seed: int


class _Trajectory:
    """An episode's state so far; turned into the result file at its end."""

    def __init__(self, task: Task, setup: EpisodeSetup, client: Any):
        self.task, self.setup, self.client = task, setup, client
        self.messages: list[dict] = []
        self.step_num = 0          # env steps taken (replayed + model)
        self.model_steps = 0       # steps the evaluated model chose
        self.score = 0.0

    def act(self, turn: str) -> str | None:
        """Step one turn's action; how the episode ended, or None."""
        spec = self.setup.spec
        out = self.client.step(spec.prepare_action(self.client, conv.parse_action(turn)))
        self.step_num += 1
        self.messages = conv.append_turn(self.messages, turn, out.state)
        scored = spec.step_score(out.reward)
        self.score = scored.score
        return "disaster" if scored.disaster else "done" if out.done else None

    def result(self, ended_by: str, error: str | None = None) -> dict[str, Any]:
        failed = ended_by == "error"
        return {
            "task_id": self.task.idx,
            "env_score": 0.0 if failed else self.score,
            "model_name": self.setup.model_name,
            "step_num": self.step_num,
            "state": self.messages,
            "success": not failed and self.setup.spec.is_success(self.score),
            "ended_by": ended_by,
            "model_steps": self.model_steps,
            "replayed_steps": len(self.task.prefix_turns),
            "error": error,
        }


class Episode:
    """A driver job: reset, replay the revise prefix, then one model turn per
    request until done, a disaster or ``max_steps`` model turns. The driver
    reruns ``run`` from scratch on a fresh client after an env error."""

    def __init__(self, task: Task, setup: EpisodeSetup):
        self.task, self.setup = task, setup
        self.key = task.key
        self._last: _Trajectory | None = None   # the latest attempt, for the failure record

    def run(self, client: Any) -> Generator[GenerationRequest, list[str], dict[str, Any]]:
        traj = self._last = _Trajectory(self.task, self.setup, client)
        client.reset(self.task.idx)
        traj.messages = conv.initial_conversation(client.instruction, client.observe())
        for turn in self.task.prefix_turns:
            ended = traj.act(turn)
            if ended:
                return traj.result(ended)
        while True:
            samples = yield GenerationRequest(traj.messages, n=1,
                                              seed=derive_seed(self.setup.seed, self.key, traj.model_steps))
            traj.model_steps += 1
            ended = traj.act(samples[0])
            if ended or traj.model_steps >= self.setup.max_steps:
                return traj.result(ended or "step_limit")

    def failed(self, exc: BaseException) -> dict[str, Any]:
        """The result file of an episode whose env kept failing: the last
        attempt's trajectory, score 0; a rerun redoes it."""
        traj = self._last or _Trajectory(self.task, self.setup, None)
        return traj.result("error", error=f"{type(exc).__name__}: {exc}")


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

    def __init__(self, run_dir: Path, progress: tqdm):
        self.run_dir, self.progress = run_dir, progress
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
        atomic_write_json(result_path(self.run_dir, episode.key), result)
        self.items[episode.key] = {"env_score": result["env_score"], "step_num": result["step_num"],
                                   "ended_by": result["ended_by"], "env_restarts": outcome.restarts}
        self.progress.update(1)


def evaluate(settings: EvalSettings, backend: Backend | None, new_client: Callable[[], Any] | None = None,
             clients: list[Any] | None = None, planned: Plan | None = None) -> EvalRun:
    """Run the episodes still missing in the run directory with ``backend``,
    then write and return the run's summary (library use: tests, benches).

    ``clients`` are already-open env clients to reuse; they are closed here.
    ``new_client`` replaces the task's client factory (tests wrap it)."""
    validate(settings)
    settings.finish()
    planned = planned if planned is not None else plan(settings)
    run_dir = settings.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    if planned.todo:
        if backend is None:
            raise ValueError("a backend is needed when tasks remain")
        failed = _run_todo(settings, backend, planned, new_client, clients)
    else:
        for client in clients or []:
            close_quietly(client)
    summary = _write_summary(settings, planned.spec, run_dir, backend)
    return EvalRun(run_dir, summary, ran=len(planned.todo), failed=failed,
                   skipped=len(planned.tasks) - len(planned.todo))


def _run_todo(settings: EvalSettings, backend: Backend, planned: Plan, new_client: Callable[[], Any] | None,
              clients: list[Any] | None) -> int:
    """Play ``planned.todo``; returns how many failed for good. The manifest
    is written also when interrupted (``finished`` stays null then)."""
    spec, run_dir = planned.spec, settings.run_dir()
    setup = EpisodeSetup(spec, settings.model_name, settings.max_steps, settings.seed)
    new_client = new_client or (lambda: spec.make_client(settings.env_server_base,
                                                         instruction_file=settings.backend.instruction_file))
    cfg = DriverConfig(SamplingConfig(temperature=settings.temperature, max_new_tokens=settings.max_new_tokens),
                       settings.max_token_length, settings.concurrency, settings.env_retries,
                       settings.env_retry_delay)
    started, finished = time.time(), None
    with tqdm(total=len(planned.todo), desc=f"eval {spec.name}", unit="task") as bar:
        record = _Recorder(run_dir, bar)
        try:
            run_jobs([Episode(t, setup) for t in planned.todo], backend, new_client, cfg, record, clients=clients)
            finished = time.time()
        finally:
            write_manifest(run_dir / manifest_name(settings.shard, MANIFEST_FILE), settings.run_config(), backend,
                           backend.stats.as_dict(), started, finished, record.items)
    return record.failed


def _write_summary(settings: EvalSettings, spec: EnvSpec, run_dir: Path, backend: Backend | None) -> dict[str, Any]:
    summary = summarize_dir(run_dir, spec)
    summary["mode"] = "revise" if settings.revise_from else "test"
    summary["config"] = settings.run_config()
    if backend is not None:
        summary["backend"] = backend.describe()
        summary["backend_stats"] = backend.stats.as_dict()
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    return summary


def run(settings: EvalSettings) -> EvalRun:
    """eval.py's whole job: plan (resume), open one env client first so an
    unreachable server fails in seconds instead of after loading the model,
    make the backend, play the missing episodes, write results, manifest and
    summary. When nothing is left, neither the model nor the server is needed."""
    validate(settings)
    settings.finish()
    planned = plan(settings)
    log.info("%d tasks, %d already done in %s", len(planned.tasks), len(planned.tasks) - len(planned.todo),
             settings.run_dir())
    if not planned.todo:
        return evaluate(settings, None, planned=planned)
    client = planned.spec.make_client(settings.env_server_base, instruction_file=settings.backend.instruction_file)
    backend = None
    try:
        backend = make_backend(settings.backend, seed=settings.seed,
                               max_model_len=settings.max_token_length + settings.max_new_tokens)
        return evaluate(settings, backend, clients=[client], planned=planned)
    finally:
        close_quietly(client)   # already closed by the driver unless make_backend failed; closing is idempotent
        if backend is not None:
            backend.close()
