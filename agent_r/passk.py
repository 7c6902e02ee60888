"""Pass@k of a sampled eval (``eval.py --samples K``): the chance that at least
one of k episodes of a task succeeds, averaged over tasks, with a bootstrap
interval over tasks.

Why these choices:
* The unbiased estimator (Chen et al. 2021, the Codex paper), per task with
  n episodes of which c succeeded: 1 - C(n-c, k) / C(n, k). Taking the
  success rate to the k-th power instead is biased low for small n; taking
  "any success among the first k" throws away the other n - k episodes.
* The interval resamples tasks, not episodes: the question is how the number
  would move on another draw of test tasks of the same kind, and the
  episodes of one task are not independent of each other in that sense.
  1,000 resamples with a fixed seed, so a summary is the same file every
  time it is written. A difference between two models resamples the same
  tasks for both (paired), which is much tighter than two separate
  intervals when the models succeed on the same tasks.
* k runs over 1, 2, 4, ... up to the smallest n of any task, and that n
  itself: the doubling grid is what a Pass@k curve is drawn on.

Reads result files only (the ``task_key`` and ``sample`` fields a sampled
eval writes); runs no model.
"""
from __future__ import annotations

import math
import random
from typing import Any, Iterable, Mapping

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of Pass@k from n episodes with c successes."""
    if not 0 <= c <= n:
        raise ValueError(f"successes must be between 0 and the episodes ({n}), got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"Pass@{k} needs at least {k} episodes of each task, got {n}: sample more (--samples) "
                         f"or ask for a smaller k")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_grid(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n`` itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


def task_counts(results: Iterable[Mapping[str, Any]], success: Any) -> dict[str, dict[str, int]]:
    """Episodes and successes per task key, from a sampled eval's result
    files (``success(result) -> bool``); results without a ``task_key``
    (a one-episode run) count under their ``task_id``."""
    counts: dict[str, dict[str, int]] = {}
    for r in results:
        key = str(r.get("task_key", r.get("task_id")))
        entry = counts.setdefault(key, {"episodes": 0, "successes": 0})
        entry["episodes"] += 1
        entry["successes"] += int(bool(success(r)))
    return dict(sorted(counts.items(), key=lambda kv: _natural(kv[0])))


def _natural(key: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in key.replace("_", " ").split())


def per_task(counts: Mapping[str, Mapping[str, int]], k: int) -> dict[str, float]:
    return {key: pass_at_k(c["episodes"], c["successes"], k) for key, c in counts.items()}


def bootstrap_interval(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """The 95% percentile interval of the mean of ``values`` over resamples
    of them with replacement."""
    if not values:
        raise ValueError("no tasks to resample")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]


def summarize(counts: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Any]]:
    """``{"k": {"value": mean Pass@k, "ci95": [low, high]}}`` for every k of
    the grid that every task has episodes enough for."""
    if not counts:
        return {}
    out = {}
    for k in k_grid(min(c["episodes"] for c in counts.values())):
        values = list(per_task(counts, k).values())
        low, high = bootstrap_interval(values)
        out[str(k)] = {"value": _round(sum(values) / len(values)), "ci95": [_round(low), _round(high)]}
    return out


def paired_difference(reference: Mapping[str, Mapping[str, int]], other: Mapping[str, Mapping[str, int]],
                      k: int) -> dict[str, Any] | None:
    """``other`` minus ``reference`` in Pass@k on the tasks both played with
    at least k episodes, with the paired bootstrap interval; None when no
    task is shared."""
    keys = [key for key in reference if key in other
            and min(reference[key]["episodes"], other[key]["episodes"]) >= k]
    if not keys:
        return None
    diffs = [pass_at_k(other[key]["episodes"], other[key]["successes"], k)
             - pass_at_k(reference[key]["episodes"], reference[key]["successes"], k) for key in keys]
    low, high = bootstrap_interval(diffs)
    return {"tasks": len(keys), "value": _round(sum(diffs) / len(diffs)), "ci95": [_round(low), _round(high)]}


def solved_overlap(reference: Mapping[str, Mapping[str, int]], other: Mapping[str, Mapping[str, int]]
                   ) -> dict[str, int] | None:
    """Tasks solved at least once by each run, on the tasks both played with
    as many episodes: whether ``other`` reaches tasks ``reference`` never
    does (it widens) or only solves the same ones more often (it sharpens),
    which Pass@k's averages alone do not show. Unequal episode counts (a
    run still going) would favour the run with more tries, so such tasks are
    left out. None when no task is shared."""
    keys = [key for key in reference if key in other and reference[key]["episodes"] == other[key]["episodes"]]
    if not keys:
        return None
    ref = {key for key in keys if reference[key]["successes"]}
    new = {key for key in keys if other[key]["successes"]}
    return {"tasks": len(keys), "both": len(ref & new), "only_other": len(new - ref), "only_reference": len(ref - new)}


def percent_cell(entry: Mapping[str, Any] | None, signed: bool = False) -> str:
    """``{"value", "ci95"}`` as a table shows it: "41.5 [33.0, 50.0]" (percent),
    with signs for a difference; "-" for none."""
    if not entry:
        return "-"
    sign = "+" if signed else ""
    low, high = entry["ci95"]
    return f"{100 * entry['value']:{sign}.1f} [{100 * low:{sign}.1f}, {100 * high:{sign}.1f}]"


def _round(x: float) -> float:
    return round(x, 6)
