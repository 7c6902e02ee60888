"""How sure an eval's numbers are. A success rate gets Wilson's 95%
interval (right at 0 and 100% and for the small counts of revising
episodes, where the normal approximation is not). Two greedy evals of the
same tasks (two models, two replies to the revision turn, two dtypes) are
paired. They differ on few tasks;
what matters is how many one solves that the other does not (``gained``)
and the reverse (``lost``). McNemar's exact test asks whether that split
could be chance: under "no difference" each discordant task is a fair coin,
so the two-sided p-value is twice the binomial tail of the smaller count
(capped at 1). Exact rather than the chi-square approximation, because with
100 test tasks the discordant counts are small. (Pass@k of sampled evals
pairs by a bootstrap over tasks instead: agent_r/passk.py.)"""
from __future__ import annotations

import math
from typing import Any, Optional


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


def wilson_interval(successes: int, n: int, z: float = 1.96) -> Optional[tuple[float, float]]:
    """Wilson's score interval for ``successes`` of ``n`` (95% at the default
    z), as fractions; None for n = 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n ({n}), got {successes}")
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
