"""The unseen-task picker (agent_r/loop/search_tasks.py ``pick``): n tasks
spread over the strata in proportion to their sizes, the seats left after
each stratum's whole share going to the largest remainders first."""
from __future__ import annotations

from collections import Counter

import pytest

from agent_r.loop.search_tasks import pick

# strata of 5, 3 and 2 tasks: a = 0..4, b = 5..7, c = 8..9
STRATUM = {**{i: 0 for i in range(5)}, **{i: 1 for i in range(5, 8)}, **{i: 2 for i in range(8, 10)}}


@pytest.mark.parametrize("n,want", [
    (4, {0: 2, 1: 1, 2: 1}),   # shares 2.0, 1.2, 0.8: the one seat left goes to c (remainder 0.8), not b (0.2)
    (3, {0: 1, 1: 1, 2: 1}),   # shares 1.5, 0.9, 0.6: floors 1, 0, 0; two seats left go to b (0.9) and c (0.6)
    (7, {0: 4, 1: 2, 2: 1}),   # shares 3.5, 2.1, 1.4: floors 3, 2, 1; the seat left goes to a (0.5)
])
def test_leftover_tasks_go_to_the_largest_remainders_first(n, want):
    for seed in range(5):
        got = pick(list(range(10)), n, seed, STRATUM.get)
        assert len(got) == n == len(set(got)) and got == sorted(got)
        assert dict(Counter(STRATUM[i] for i in got)) == want


def test_fewer_candidates_than_asked_gives_them_all():
    assert pick([3, 1, 2], 5, 0) == [1, 2, 3]
