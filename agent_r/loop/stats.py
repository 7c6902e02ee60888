"""The statistics a reviewer asks of the loop's results, beyond success rates.

* Paired comparisons (agent_r/significance.py): every model against the base
  and agent-r against direct, episode by episode, McNemar's exact test.
* Revision turns. Agent-R's claim is that the model learns to revise in the
  middle of an episode. A test episode shows it when a turn the model chose
  is a revision turn: its thought is one of the revision thoughts training
  samples put there (agent_r/revision.py), or its action is the ``wait``
  the splice gives that turn (except in SciWorld, where ``wait`` is a game
  action). Counted per episode, with how many of those episodes then succeed.

Everything here reads result files or finished rows; it runs no model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from agent_r.io import read_json
from agent_r.significance import paired
from agent_r.report import refused_action_counts, revision_turn_counts
from agent_r.paths import result_file
# what a revision turn is lives with the splice that makes it (re-exported here)
from agent_r.revision import is_revision_turn, revision_turns

__all__ = ["is_revision_turn", "revision_turns", "episode_stats", "comparisons"]


# --------------------------------------------------------------------------- revision turns

def episode_stats(run_dir: str | Path, keys: Iterable[str], task: str = "textcraft") -> dict[str, Any]:
    """Per-episode success (``outcomes``, key -> 1/0: what paired comparisons
    need) and the revision-turn counts (agent_r.report's, the summaries')
    of the episodes ``keys`` in an eval run folder; an episode without a
    readable result file is left out."""
    outcomes: dict[str, int] = {}
    results = []
    for key in keys:
        try:
            result = read_json(result_file(Path(run_dir), key))
        except (ValueError, OSError):
            continue
        outcomes[key] = int(bool(result.get("success")))
        results.append(result)
    return {"outcomes": outcomes, "revision_turns": revision_turn_counts(results, task),
            "refused_actions": refused_action_counts(results, task)}


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
