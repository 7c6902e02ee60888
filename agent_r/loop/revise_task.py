"""The revision task (paper Table 3): the base model's failed test episodes,
replayed for every model of the loop, which continues them (``eval.py
--revise_from``). The same episodes for every model, so the scores compare."""
from __future__ import annotations

from pathlib import Path

from agent_r import report
from agent_r.io import atomic_write_jsonl


def revise_tasks_file(folder: Path, task: str) -> Path:
    """Where the base eval keeps one task's revision-task episodes."""
    return folder / f"revise_tasks_{task}.jsonl"


def write_revise_tasks(run_dir: Path, target: Path, limit: int) -> int:
    """The first ``limit`` failed test episodes of the eval in ``run_dir``
    that ran out of steps (a disaster would only end again on replay), as
    ``{task_num, messages}`` rows for ``eval.py --revise_from``; returns how
    many were written."""
    rows = []
    for result in sorted(report.load_results(run_dir), key=lambda r: int(r["task_id"])):
        if not result.get("success") and result.get("ended_by") == "step_limit" and len(rows) < limit:
            rows.append({"task_num": result["task_id"], "messages": result["state"]})
    atomic_write_jsonl(target, rows)
    return len(rows)
