"""Evaluation: run the policy on held-out tasks, write one result per task,
and summarise a run directory (SPEC section 5, plus the revision task).

Why the shape below:
* Episodes run side by side (``concurrency``), each with its own env client,
  and every step all episodes waiting for a turn share ONE ``backend.generate``
  call. Model calls dominate wall time, so batching them is the speed-up.
* Each request carries a seed derived from (seed, task, step), so a
  deterministic backend gives the same trajectories at any concurrency and
  after a resume.
* The summary is always recomputed from every result file in the run
  directory, so "interrupted + resumed" reports exactly what an uninterrupted
  run reports.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from agent_r import conversation as conv
from agent_r.settings import UsageError
from agent_r.io import atomic_write_json, read_json
from agent_r.llm import Backend, GenerationRequest, SamplingConfig, derive_seed
from agent_r.manifest import write_manifest
from agent_r.envs import EnvSpec, get_env

log = logging.getLogger(__name__)

RESULT_PREFIX = "search_results_"
SUMMARY_FILE = "summary.json"
MANIFEST_FILE = "manifest.json"
LOOP_LENGTHS = (1, 2, 3, 4, 5)
ENDINGS = ("done", "disaster", "step_limit", "error")


@dataclass
class EvalConfig:
    task: str
    model_name: str
    model_type: str = "eval"
    output_dir: str = "test_result"
    env_server_base: str | None = None
    max_steps: int = 100
    max_token_length: int = 4096
    max_new_tokens: int = 500
    temperature: float = 1.0
    concurrency: int = 8
    seed: int = 0
    env_retries: int = 2          # fresh-client restarts of an episode after an env error
    env_retry_delay: float = 1.0  # seconds before restarting after an unreachable server, doubled each time
    limit: int | None = None
    split_file: str | None = None
    revise_from: str | None = None

    def run_dir(self) -> Path:
        suffix = "_revise" if self.revise_from else ""
        return Path(self.output_dir) / get_env(self.task).name / f"{self.model_name}_{self.model_type}{suffix}"


@dataclass
class Job:
    """One episode to run: a task index, optionally a failed prefix to replay."""

    idx: int
    key: str                                   # file-name key: "12", or "12_0" for a revise row
    prefix_turns: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------

def result_path(run_dir: Path, key: str) -> Path:
    return run_dir / f"{RESULT_PREFIX}{key}.json"


def split_jobs(rules: EnvSpec, split_file: str | None, limit: int | None) -> list[Job]:
    indices = rules.split_indices("test", split_file)
    if limit is not None:
        indices = indices[:limit]
    return [Job(idx, str(idx)) for idx in indices]


def load_revise_jobs(path: str, limit: int | None = None) -> list[Job]:
    """Failed prefixes from path_collection JSONL (``low_log``) or any JSONL of
    ``{task_num, messages}``. One episode per row; several rows of one task
    become keys ``<task>_0``, ``<task>_1``, ..."""
    if not os.path.exists(path):
        raise UsageError(f"--revise_from {path} does not exist; pass a path_collection JSONL file")
    jobs: list[Job] = []
    seen: dict[int, int] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                idx = int(row["task_num"])
                messages = row.get("low_log") or row.get("messages")
                if not isinstance(messages, list):
                    raise KeyError("low_log")
            except (ValueError, KeyError, TypeError) as exc:
                raise UsageError(
                    f"--revise_from {path}, line {line_no}: expected a JSON object with task_num and "
                    f"low_log (or messages) ({type(exc).__name__}: {exc})"
                ) from None
            turns = [m["content"] for m in messages[conv.HEAD_LEN:] if m.get("role") == "assistant"]
            n = seen.get(idx, 0)
            seen[idx] = n + 1
            jobs.append(Job(idx, f"{idx}_{n}", turns))
    if not jobs:
        raise UsageError(f"--revise_from {path} has no rows")
    return jobs[:limit] if limit is not None else jobs


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
    ok = isinstance(data, dict) and all(k in data for k in ("task_id", "env_score", "step_num", "state"))
    if not ok:
        log.warning("%s lacks result keys; redoing it", path)
        return False
    return data.get("ended_by") != "error"


# ---------------------------------------------------------------------------
# Episodes
# ---------------------------------------------------------------------------

def _is_fatal(exc: BaseException) -> bool:
    """Unreachable servers and user mistakes abort the run: every later task
    would fail the same way."""
    from agentenv_client import EnvServerUnreachable

    return isinstance(exc, (UsageError, EnvServerUnreachable))


class Episode:
    """One task's trajectory, advanced a turn at a time by the scheduler."""

    def __init__(self, job: Job, rules: EnvSpec, cfg: EvalConfig):
        self.job, self.rules, self.cfg = job, rules, cfg
        self.client = None
        self.attempt = 0
        self.restart = False       # set after an env error: start again on a fresh client
        self.result: dict[str, Any] | None = None
        self._clear()

    def _clear(self) -> None:
        self.messages: list[dict] = []
        self.step_num = 0          # env steps taken (replayed + model)
        self.model_steps = 0       # steps the evaluated model chose
        self.score = 0.0

    # -- env side (runs in worker threads) ---------------------------------
    def start(self, new_client: Callable[[], Any]) -> None:
        """Reset to the task and replay the failed prefix, if any."""
        self._clear()
        if self.client is None:
            self.client = new_client()
        self.client.reset(self.job.idx)
        self.messages = conv.initial_conversation(self.client.instruction, self.client.observe())
        for turn in self.job.prefix_turns:
            if self._act(turn):
                return

    def take_turn(self, turn: str) -> None:
        self.model_steps += 1
        if not self._act(turn) and self.model_steps >= self.cfg.max_steps:
            self._finish("step_limit")

    def _act(self, turn: str) -> bool:
        """Step one turn's action; True when the episode ended."""
        action = self.rules.prepare_action(self.client, conv.parse_action(turn))
        out = self.client.step(action)
        self.step_num += 1
        self.messages = conv.append_turn(self.messages, turn, out.state)
        scored = self.rules.step_score(out.reward)
        self.score = scored.score
        if scored.disaster:
            self._finish("disaster")
        elif out.done:
            self._finish("done")
        return self.result is not None

    def fail(self, exc: BaseException) -> None:
        self._finish("error", error=f"{type(exc).__name__}: {exc}")

    def _finish(self, ended_by: str, error: str | None = None) -> None:
        self.result = {
            "task_id": self.job.idx,
            "env_score": self.score if ended_by != "error" else 0.0,
            "model_name": self.cfg.model_name,
            "step_num": self.step_num,
            "state": self.messages,
            "success": ended_by != "error" and self.rules.is_success(self.score),
            "ended_by": ended_by,
            "model_steps": self.model_steps,
            "replayed_steps": len(self.job.prefix_turns) if self.job.prefix_turns else 0,
            "error": error,
        }

    def drop_client(self) -> None:
        _close(self.client)
        self.client = None


def _close(client: Any) -> None:
    if client is None:
        return
    try:
        client.close()
    except Exception:  # noqa: BLE001 - the server may already be gone
        log.debug("closing env client failed", exc_info=True)


def run_episodes(jobs: list[Job], backend: Backend, rules: EnvSpec, cfg: EvalConfig,
                 new_client: Callable[[], Any], on_result: Callable[[dict, Job], None],
                 progress: tqdm | None = None, clients: list | None = None) -> None:
    """Run ``jobs`` with up to ``cfg.concurrency`` live episodes; each round,
    every live episode gets its next turn from one batched generate call.

    Env clients are kept per slot and reused across episodes (a SciWorld
    client owns a JVM); a client that raised is discarded and the episode is
    restarted from its reset on a fresh client, at most ``cfg.env_retries``
    times, then recorded as failed."""
    sampling = SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    pending = deque(jobs)
    live: list[Episode] = []
    spare_clients: list[Any] = list(clients or [])
    if cfg.max_steps < 1:
        raise UsageError(f"--max_steps must be >= 1 (got {cfg.max_steps})")

    def guarded(ep: Episode, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - env failures are recorded, not fatal
            unreachable = _is_fatal(exc) and not isinstance(exc, UsageError)
            if isinstance(exc, UsageError) or (unreachable and ep.attempt >= cfg.env_retries):
                raise
            log.warning("task %s: env error (attempt %d): %s", ep.job.key, ep.attempt + 1, exc)
            ep.drop_client()
            ep.attempt += 1
            if ep.attempt > cfg.env_retries:
                ep.fail(exc)
            else:
                ep.result = None
                ep.restart = True
                if unreachable:  # give a restarting server time to come back
                    time.sleep(cfg.env_retry_delay * 2 ** (ep.attempt - 1))

    def start(ep: Episode) -> None:
        ep.restart = False
        guarded(ep, lambda: ep.start(new_client))

    try:
        with ThreadPoolExecutor(max_workers=max(1, cfg.concurrency)) as pool:
            while pending or live:
                fresh = []
                while pending and len(live) + len(fresh) < cfg.concurrency:
                    ep = Episode(pending.popleft(), rules, cfg)
                    if spare_clients:
                        ep.client = spare_clients.pop()
                    fresh.append(ep)
                live += fresh
                to_start = [ep for ep in live if ep.restart] + fresh
                while to_start:  # each failed start spends an attempt, so this ends
                    list(pool.map(start, to_start))
                    to_start = [ep for ep in to_start if ep.restart]

                live = _retire(live, spare_clients, on_result, progress)
                if not live:
                    continue
                requests = [
                    GenerationRequest(
                        conv.truncate(ep.messages, cfg.max_token_length, backend.count_tokens),
                        n=1, seed=derive_seed(cfg.seed, ep.job.key, ep.model_steps),
                    )
                    for ep in live
                ]
                outputs = backend.generate(requests, sampling)
                if len(outputs) != len(live) or any(len(o) < 1 for o in outputs):
                    raise RuntimeError(f"backend returned {len(outputs)} outputs for {len(live)} requests")
                list(pool.map(lambda ep, out: guarded(ep, lambda: ep.take_turn(out[0])), live, outputs))
                live = _retire(live, spare_clients, on_result, progress)
    finally:
        # After the pool has shut down (it waits for running env work, also on
        # Ctrl-C), so no worker can open a client after this closes them.
        for ep in live:
            ep.drop_client()
        for client in spare_clients:
            _close(client)


def _retire(live: list[Episode], spare_clients: list, on_result, progress) -> list[Episode]:
    still = []
    for ep in live:
        if ep.result is None or ep.restart:
            still.append(ep)
            continue
        on_result(ep.result, ep.job)
        if ep.client is not None:
            spare_clients.append(ep.client)
            ep.client = None
        if progress is not None:
            progress.update(1)
    return still


# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------

def episode_actions(state: list[dict]) -> list[str]:
    """The actions of a stored trajectory (lower-cased, spaces collapsed)."""
    return [" ".join(conv.parse_action(m["content"]).lower().split())
            for m in state[conv.HEAD_LEN:] if m.get("role") == "assistant"]


def _primitive(block: list[str]) -> bool:
    """False when the block is itself a shorter block repeated (a a, a b a b)."""
    k = len(block)
    return not any(k % d == 0 and block == block[:d] * (k // d) for d in range(1, k))


def count_repeats(actions: list[str], k: int) -> int:
    """Loops of period k: positions i where the block actions[i:i+k] is
    immediately repeated (actions[i+k:i+2k] is the same) and the block is not a
    shorter block repeated. A run of m identical actions counts m-1 at k=1 and
    nothing at k=2; "a b a b a b" counts 3 at k=2 (i = 0, 1, 2)."""
    return sum(
        1 for i in range(len(actions) - 2 * k + 1)
        if actions[i:i + k] == actions[i + k:i + 2 * k] and _primitive(actions[i:i + k])
    )


def load_results(run_dir: str | os.PathLike) -> list[dict]:
    """Every per-task result in a run directory, ordered by file key."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    results = []
    for path in sorted(run_dir.glob(f"{RESULT_PREFIX}*.json")):
        try:
            data = read_json(path)
        except ValueError as exc:
            log.warning("skipping %s", exc)
            continue
        if isinstance(data, dict) and "env_score" in data and "state" in data:
            results.append(data)
        else:
            log.warning("skipping %s: not a result file", path)
    return results


def summarize(results: list[dict], max_score: float) -> dict[str, Any]:
    """Aggregate numbers of a run. Scores are normalised by the task's max
    score (SciWorld 100) and reported x100, the paper's unit; failed episodes
    count with score 0."""
    n = len(results)
    ended = {e: sum(1 for r in results if r.get("ended_by") == e) for e in ENDINGS}
    loops = {}
    for k in LOOP_LENGTHS:
        counts = [count_repeats(episode_actions(r["state"]), k) for r in results]
        with_loop = sum(1 for c in counts if c)
        loops[str(k)] = {"episodes": with_loop, "fraction": with_loop / n if n else 0.0, "count": sum(counts)}
    mean = (lambda xs: sum(xs) / n if n else 0.0)
    return {
        "tasks": n,
        "score_x100": round(100.0 * mean([float(r["env_score"]) / max_score for r in results]), 6),
        "success_rate": mean([1.0 if _success(r, max_score) else 0.0 for r in results]),
        "mean_steps": mean([float(r["step_num"]) for r in results]),
        "step_limit": ended["step_limit"],
        "disaster": ended["disaster"],
        "failed": ended["error"],
        "loops": loops,
    }


def _success(result: dict, max_score: float) -> bool:
    if "success" in result:
        return bool(result["success"])
    return float(result["env_score"]) >= max_score  # files written by the reference scripts


def summarize_dir(run_dir: str | os.PathLike, rules: EnvSpec) -> dict[str, Any]:
    return {"run_dir": str(run_dir), "task": rules.name, **summarize(load_results(run_dir), rules.max_score)}


def format_table(summaries: list[dict[str, Any]], labels: list[str] | None = None) -> str:
    """Runs side by side, one column each (iteration 0 vs 1 vs 2)."""
    labels = labels or [Path(s["run_dir"]).name for s in summaries]
    rows: list[tuple[str, list[str]]] = [
        ("task", [s["task"] for s in summaries]),
        ("tasks", [str(s["tasks"]) for s in summaries]),
        ("score x100", [f"{s['score_x100']:.2f}" for s in summaries]),
        ("success rate %", [f"{100 * s['success_rate']:.2f}" for s in summaries]),
        ("mean steps", [f"{s['mean_steps']:.2f}" for s in summaries]),
        ("ended by step limit", [str(s["step_limit"]) for s in summaries]),
        ("ended by disaster", [str(s["disaster"]) for s in summaries]),
        ("failed (env error)", [str(s["failed"]) for s in summaries]),
    ]
    for k in LOOP_LENGTHS:
        rows.append((f"loop k={k} % eps / count",
                     [f"{100 * s['loops'][str(k)]['fraction']:.1f} / {s['loops'][str(k)]['count']}" for s in summaries]))
    first = max(len(r[0]) for r in rows)
    widths = [max(len(labels[i]), *(len(r[1][i]) for r in rows)) for i in range(len(summaries))]
    line = lambda name, cells: "  ".join([name.ljust(first)] + [c.rjust(w) for c, w in zip(cells, widths)])
    return "\n".join([line("metric", labels), line("-" * first, ["-" * w for w in widths])]
                     + [line(name, cells) for name, cells in rows])


def rules_for_dir(run_dir: str | os.PathLike, task: str | None) -> EnvSpec:
    """A run's task: from its summary.json, else the parent folder name
    ({output_dir}/{TASK}/{model}), else the TASK the user set."""
    run_dir = Path(run_dir)
    summary = run_dir / SUMMARY_FILE
    if summary.exists():
        try:
            return get_env(read_json(summary)["task"])
        except (ValueError, KeyError, TypeError, UsageError):
            pass
    try:
        return get_env(run_dir.resolve().parent.name)
    except UsageError:
        if task:
            return get_env(task)
        raise UsageError(f"cannot tell which task {run_dir} holds: set TASK=textcraft|sciworld|webshop") from None


def compare(run_dirs: list[str], task: str | None = None) -> str:
    return format_table([summarize_dir(d, rules_for_dir(d, task)) for d in run_dirs])


# ---------------------------------------------------------------------------
# A whole run
# ---------------------------------------------------------------------------

def plan(cfg: EvalConfig) -> tuple[EnvSpec, list[Job], list[Job]]:
    """(rules, all jobs, jobs still to run). Validates TASK, split and revise file."""
    rules = get_env(cfg.task)
    if cfg.limit is not None and cfg.limit < 1:
        raise UsageError(f"--limit must be >= 1 (got {cfg.limit})")
    if cfg.revise_from:
        jobs = load_revise_jobs(cfg.revise_from, cfg.limit)
    else:
        jobs = split_jobs(rules, cfg.split_file, cfg.limit)
    run_dir = cfg.run_dir()
    todo = [j for j in jobs if not is_complete(result_path(run_dir, j.key))]
    return rules, jobs, todo


def run_eval(cfg: EvalConfig, backend: Backend | None, rules: EnvSpec, todo: list[Job],
             new_client: Callable[[], Any] | None = None, clients: list | None = None) -> dict[str, Any]:
    """Run the missing episodes, then write and return the run's summary.

    ``clients`` are already-open env clients to reuse (the script opens one
    first to fail fast on an unreachable server before loading the model)."""
    run_dir = cfg.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    new_client = new_client or (lambda: rules.make_client(cfg.env_server_base))
    if todo:
        if backend is None:
            raise ValueError("a backend is needed when tasks remain")
        items: dict[str, Any] = {}

        def write(result: dict, job: Job) -> None:
            atomic_write_json(result_path(run_dir, job.key), result)
            items[job.key] = {k: result[k] for k in ("env_score", "step_num", "ended_by")}

        started, finished = time.time(), None
        try:
            with tqdm(total=len(todo), desc=f"eval {rules.name}", unit="task") as bar:
                run_episodes(todo, backend, rules, cfg, new_client, write, bar, clients)
            finished = time.time()
        finally:  # provenance of what this invocation wrote; finished stays null when interrupted
            write_manifest(run_dir / MANIFEST_FILE, asdict(cfg), backend, backend.stats.as_dict(),
                           started, finished, items)
    else:
        for client in clients or []:
            _close(client)
    summary = summarize_dir(run_dir, rules)
    summary["mode"] = "revise" if cfg.revise_from else "test"
    summary["config"] = asdict(cfg)
    if backend is not None:
        summary["backend"] = backend.describe()
        summary["backend_stats"] = backend.stats.as_dict()
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    return summary


def evaluate(cfg: EvalConfig, backend: Backend, new_client: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Plan + run in one call (library use: tests, benches, the demo)."""
    rules, _, todo = plan(cfg)
    return run_eval(cfg, backend, rules, todo, new_client=new_client)
