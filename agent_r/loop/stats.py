"""The statistics a reviewer asks of the loop's results, beyond success rates.

* Paired comparisons. Two models evaluated on the same test tasks differ on
  few of them; what matters is how many tasks one solves that the other does
  not (``gained``) and the reverse (``lost``). McNemar's exact test asks
  whether that split could be chance: under "no difference" each discordant
  task is a fair coin, so the two-sided p-value is twice the binomial tail of
  the smaller count (capped at 1). Exact rather than the chi-square
  approximation, because with 100 test tasks the discordant counts are small.
* Revision turns. Agent-R's claim is that the model learns to revise in the
  middle of an episode. A test episode shows it when a turn the model chose
  is a revision turn: its thought is one of the revision thoughts training
  samples put there (agent_r/revision.py), or its action is the ``wait``
  the splice gives that turn (except in SciWorld, where ``wait`` is a game
  action). Counted per episode, with how many of those episodes then succeed.

Everything here reads result files or finished rows; it runs no model.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Optional

from agent_r.io import read_json
from agent_r.paths import result_file
# what a revision turn is lives with the splice that makes it (re-exported here)
from agent_r.revision import is_revision_turn, revision_turns

__all__ = ["mcnemar_exact", "paired", "is_revision_turn", "revision_turns", "episode_stats", "comparisons"]


# --------------------------------------------------------------------------- McNemar

def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value of ``gained`` vs ``lost`` discordant
    pairs: 2 x P(X <= min) for X ~ Binomial(gained + lost, 1/2), at most 1."""
    if gained < 0 or lost < 0:
        raise ValueError(f"discordant counts must be >= 0, got {gained} and {lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def paired(reference: dict[str, int], other: dict[str, int]) -> Optional[dict[str, Any]]:
    """``other`` against ``reference`` on the episodes both played (keys:
    task ids): how many, both solved, gained (solved by ``other`` only), lost
    (by ``reference`` only) and McNemar's p-value; None when none is shared."""
    keys = sorted(set(reference) & set(other))
    if not keys:
        return None
    gained = sum(1 for k in keys if other[k] and not reference[k])
    lost = sum(1 for k in keys if reference[k] and not other[k])
    return {"tasks": len(keys), "both": sum(1 for k in keys if other[k] and reference[k]), "gained": gained,
            "lost": lost, "p_value": float(f"{mcnemar_exact(gained, lost):.4g}")}


# --------------------------------------------------------------------------- revision turns

def episode_stats(run_dir: str | Path, keys: Iterable[str], task: str = "textcraft") -> dict[str, Any]:
    """Per-episode success (``outcomes``, key -> 1/0: what paired comparisons
    need) and the revision-turn counts of the episodes ``keys`` in an eval
    run folder; an episode without a readable result file is left out."""
    outcomes: dict[str, int] = {}
    with_turn = succeeded = turns = 0
    for key in keys:
        path = result_file(Path(run_dir), key)
        try:
            result = read_json(path)
        except (ValueError, OSError):
            continue
        outcomes[key] = int(bool(result.get("success")))
        n = revision_turns(result, task)
        turns += n
        with_turn += n > 0
        succeeded += n > 0 and bool(result.get("success"))
    return {"outcomes": outcomes, "revision_turns": {"episodes": with_turn, "succeeded": succeeded, "turns": turns}}


# --------------------------------------------------------------------------- over the rows

def _outcomes(row: Optional[dict], part: str, task: str) -> Optional[dict[str, int]]:
    return ((row or {}).get(part, {}).get(task) or {}).get("outcomes")


def comparisons(rows: list[dict]) -> dict[tuple[int, str], dict[str, Any]]:
    """(iteration, variant) -> {part: {task: {"vs_base": ..., "vs_direct": ...}}}
    for the test split and the revision task: every model against the base
    model, and agent-r against direct of the same iteration, on the same
    episodes. Rows written before outcomes were recorded compare to nothing."""
    base = next((r for r in rows if r["iteration"] == 0), None)
    by = {(r["iteration"], r["variant"]): r for r in rows}
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for r in rows:
        if r["iteration"] == 0:
            continue
        got: dict[str, Any] = {}
        for part in ("test", "revise_task"):
            for task in r.get(part, {}):
                mine = _outcomes(r, part, task)
                if mine is None:
                    continue
                entry = {}
                ref = _outcomes(base, part, task)
                if ref is not None:
                    entry["vs_base"] = paired(ref, mine)
                direct = _outcomes(by.get((r["iteration"], "direct")), part, task)
                if r["variant"] == "agent-r" and direct is not None:
                    entry["vs_direct"] = paired(direct, mine)
                if entry:
                    got.setdefault(part, {})[task] = entry
        out[(r["iteration"], r["variant"])] = got
    return out
