"""The revision task (paper Table 3): the base model's failed test episodes,
each cut at a randomly chosen step; every model of the loop continues from
there (at most ``--revise_max_steps`` turns) and is scored like the main
evaluation. The same cut episodes for every model, so the scores compare.

How a cut reaches the episode: ``eval.py --revise_from`` replays the assistant
turns of each row's ``messages`` and then lets the model play. So a row holds
the base episode's conversation up to the cut: the turns before the cut are
replayed (TextCraft is deterministic, so the replay reaches the state the
base model was in) and the model chooses every turn after it.

Which cut: uniform over the turns 1..n-1 of an n-turn episode, seeded per
(run seed, task, test task), so at least one of the base model's turns is
replayed and its last turn (the one that ended the episode, a disaster for
instance) never is. Episodes of one turn have nothing to cut and are left
out. Which episodes: every failed one (not an env error), the paper's; a cap
(``--revise_limit``) keeps a seeded sample of them, in task order.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Optional

from agent_r import conversation as conv
from agent_r import report
from agent_r.io import atomic_write_jsonl


def revise_tasks_file(folder: Path, task: str) -> Path:
    """Where the base eval keeps one task's revision-task episodes."""
    return folder / f"revise_tasks_{task}.jsonl"


def cut_messages(state: list[dict], cut: int) -> list[dict]:
    """The conversation up to the observation after the ``cut``-th assistant
    turn (the head of fixed messages always kept)."""
    out, turns = list(state[:conv.HEAD_LEN]), 0
    for m in state[conv.HEAD_LEN:]:
        if m.get("role") == "assistant":
            if turns == cut:
                break
            turns += 1
        out.append(m)
    return out


def revise_rows(results: list[dict], task: str, seed: int, limit: Optional[int]) -> tuple[list[dict], dict]:
    """(the revision-task rows of a base eval's results, counts saying how
    they were chosen)."""
    failed = [r for r in sorted(results, key=lambda r: int(r["task_id"]))
              if not r.get("success") and r.get("ended_by") != "error"]
    n_turns = {int(r["task_id"]): len(_assistant_turns(r["state"])) for r in failed}
    eligible = [r for r in failed if n_turns[int(r["task_id"])] >= 2]
    chosen = eligible
    if limit is not None and len(eligible) > limit:
        keep = set(random.Random(f"{seed}/{task}/revise_limit").sample(range(len(eligible)), limit))
        chosen = [r for i, r in enumerate(eligible) if i in keep]
    rows = []
    for r in chosen:
        idx, n = int(r["task_id"]), n_turns[int(r["task_id"])]
        cut = random.Random(f"{seed}/{task}/{idx}/cut").randint(1, n - 1)
        rows.append({"task_num": idx, "messages": cut_messages(r["state"], cut), "cut": cut, "base_turns": n,
                     "base_ended_by": r.get("ended_by")})
    counts = {"failed": len(failed), "eligible": len(eligible), "episodes": len(rows)}
    return rows, counts


def _assistant_turns(state: list[dict]) -> list[dict]:
    return [m for m in state[conv.HEAD_LEN:] if m.get("role") == "assistant"]


def write_revise_tasks(run_dir: Path, target: Path, task: str, seed: int, limit: Optional[int]) -> dict:
    """The revision-task rows of the eval in ``run_dir``, as
    ``{task_num, messages, cut, ...}`` lines for ``eval.py --revise_from``;
    returns the counts of ``revise_rows``."""
    rows, counts = revise_rows(report.load_results(run_dir), task, seed, limit)
    atomic_write_jsonl(target, rows)
    return counts
