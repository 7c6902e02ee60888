"""The loop over every GPU of its node: the search, verifier and eval stages
run as one process per GPU group, each a shard of the stage's tasks.

Why processes, and why the scripts' sharding: one process drives one model
engine on the GPUs it is given (``CUDA_VISIBLE_DEVICES``), so a node with 8
GPUs and ``--tensor_parallel_size 1`` runs 8 engines at once. Each shard is
the very library call behind mcts_collection.py, path_collection.py or
eval.py with ``--shard_index i --num_shards N`` (agent_r/sharding.py): the
same task split, one output folder, a manifest per shard, resume per task.
When every shard has ended, the loop runs the same call once in its own
process: every task is done by then, so it loads no model and only writes
what covers the whole stage (eval's summary, the rows' JSONL, the trees'
statistics). A shard that fails is reported with its log and leaves the stage
unfinished; a rerun starts the shards again and each does only what is
missing. One group (one GPU, or none: a CPU) keeps everything in the loop's
own process, as before.

    GPUS=0,1,2,3 python iterate.py ...           # 4 shards per stage
    GPUS=0,1 ... --tensor_parallel_size 2        # 1 group: in process
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from agent_r.io import atomic_write_bytes
from agent_r.knobs import ShardSettings
from agent_r.settings import EXIT_ITEMS_FAILED, EXIT_OK, UsageError, run_cli

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]

SEARCH, DATA, EVAL = "search", "data", "eval"
LOG_FOLDER = ".shards"   # in the stage's folder: one job file and one log per shard
# (not ``-m agent_r.loop.shards``: the package imports this module first, and runpy warns of that)
WORKER = "from agent_r.loop.shards import cli; cli()"


class ShardFailed(Exception):
    """A shard process of a stage exited with an error; the stage stays unfinished."""


def gpu_list(gpus: str | None, environ: Optional[dict[str, str]] = None) -> list[str]:
    """The device ids the loop may use: GPUS, else CUDA_VISIBLE_DEVICES, else
    every GPU torch sees (none on a CPU)."""
    environ = os.environ if environ is None else environ
    listed = (gpus or "").strip() or environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if listed:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:   # noqa: BLE001 - no torch, no CUDA: a CPU
        return []


def gpu_groups(devices: list[str], per_group: int) -> list[str]:
    """The devices cut into groups of ``per_group`` (one engine each, as
    CUDA_VISIBLE_DEVICES values); a UsageError where they do not divide."""
    if len(devices) % per_group:
        raise UsageError(f"{len(devices)} GPUs ({','.join(devices)}) do not split into groups of "
                         f"--tensor_parallel_size {per_group}: set GPUS to a multiple of it")
    return [",".join(devices[i:i + per_group]) for i in range(0, len(devices), per_group)]


@dataclass
class Job:
    """One shard's work: which library call, its settings (with the shard set)
    and how the loop makes a backend, so a shard's model samples exactly as
    the loop's own would."""

    kind: str
    settings: Any
    seed: int
    max_model_len: int
    root: Optional[str] = None   # eval: the run folder summaries are written relative to


def sharded(settings: Any, index: int, count: int) -> Any:
    return dataclasses.replace(settings, shard=ShardSettings(shard_index=index, num_shards=count))


def fan_out(kind: str, settings: Any, groups: list[str], folder: Path, what: str, seed: int, max_model_len: int,
            root: Optional[Path] = None) -> None:
    """Run ``kind``'s call with ``settings`` as len(groups) shard processes,
    one per GPU group, and wait for all; ShardFailed names every shard that
    exited non-zero and its log."""
    logs = Path(folder) / LOG_FOLDER
    logs.mkdir(parents=True, exist_ok=True)
    count, procs = len(groups), []
    for index, group in enumerate(groups):
        stem = logs / f"{what}-shard-{index}-of-{count}"
        job = Job(kind, sharded(settings, index, count), seed, max_model_len, str(root) if root else None)
        atomic_write_bytes(stem.with_suffix(".job"), pickle.dumps(job))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": group,   # the project importable from any folder
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(stem.with_suffix(".log"), "w", encoding="utf-8") as out:
            proc = subprocess.Popen([sys.executable, "-c", WORKER, str(stem.with_suffix(".job"))],
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append((index, group, proc, stem.with_suffix(".log")))
        log.info("%s: shard %d of %d on GPUs %s, pid %d, log %s", what, index, count, group, proc.pid,
                 stem.with_suffix(".log"))
    failed = []
    try:
        for index, group, proc, path in procs:
            code = proc.wait()
            if code != EXIT_OK:
                failed.append(f"shard {index} (GPUs {group}) exited {code}, log {path}")
    finally:   # interrupted: stop every shard, their finished items are kept
        for _, _, proc, _ in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    if failed:
        raise ShardFailed(f"{what}: {len(failed)} of {count} shards failed ({'; '.join(failed)})")


def run_job(job: Job) -> int:
    """One shard's call, as its script would make it; returns the exit code."""
    from agent_r import evaluation, revision_data, search
    from agent_r.llm import LazyBackend, make_backend

    s = job.settings
    backend = LazyBackend(lambda: make_backend(s.backend, seed=job.seed, max_model_len=job.max_model_len))
    try:
        if job.kind == SEARCH:
            return EXIT_ITEMS_FAILED if search.collect_trees(s, backend=backend).failed else EXIT_OK
        if job.kind == DATA:
            return revision_data.collect(s, backend=backend).exit_code
        if job.kind == EVAL:
            planned = evaluation.plan(s)
            done = evaluation.evaluate(s, backend if planned.todo else None, planned=planned,
                                       root=Path(job.root) if job.root else None)
            return done.exit_code
        raise UsageError(f"unknown shard job {job.kind!r}")
    finally:
        backend.close()


def cli() -> None:
    """A shard process: ``python -c WORKER JOB_FILE``, started by ``fan_out``."""
    def main() -> int:
        if len(sys.argv) != 2:
            raise UsageError("a shard process takes one job file, which the loop writes (agent_r/loop/shards.py)")
        with open(sys.argv[1], "rb") as f:
            job = pickle.load(f)   # written by this loop's own process, never by a user
        return run_job(job)
    run_cli(main)
