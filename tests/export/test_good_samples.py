"""The good-path samples mixed into the XTuner export: how many (the ratio)
and which (a seeded choice that repeats)."""
from __future__ import annotations

from agent_r import export


def test_seeded_good_sample_choice_repeats_and_depends_on_the_seed():
    """The good samples mixed in with the revision samples are a seeded choice:
    the same seed gives the same rows, other seeds other rows."""
    revisions = [{"revise_log": [{"role": "user", "content": f"r{i}"}]} for i in range(3)]
    goods = [{"revise_log": [{"role": "user", "content": f"g{i}"}]} for i in range(40)]
    first = export.xtuner_samples(revisions, goods, 1.0, seed=7)
    assert first == export.xtuner_samples(revisions, goods, 1.0, seed=7) and len(first) == 6
    assert any(export.xtuner_samples(revisions, goods, 1.0, seed=s) != first for s in range(8, 12))
