"""bench_search --ceiling: the search's own generation requests sent again
as one batch to the same backend (the pure-generation ceiling the search's
samples/s is compared with). A real search on the local TextCraft server
with the bundled model on the hf backend; no timing is asserted."""
from __future__ import annotations

import argparse

from bench.bench_search import engine_ceiling, recorded, run_one


def search_args(**over) -> argparse.Namespace:
    args = dict(backend="hf", model_dir=None, dtype="float32", tasks=1, itera=2, n_gen=2, max_depth=3, temp=1.0,
                c=0.25, max_new_tokens=20, max_token_length=1024, concurrency=2, seed=0, hf_batch_size=0,
                no_replay=False, pin=False, shard_index=0, num_shards=1, env_server_base=None, label=None,
                ceiling=True)
    return argparse.Namespace(**{**args, **over})


def test_the_ceiling_replays_exactly_the_searchs_samples():
    row = run_one(search_args())
    assert row["samples"] > 0
    assert row["ceiling_samples"] == row["samples"]          # the same requests, the same n each
    assert row["ceiling_samples_per_s"] > 0 and row["search_vs_ceiling_pct"] > 0


def test_recorded_calls_are_grouped_by_sampling_and_sent_once_each():
    from agent_r.llm.base import GenerationRequest, SamplingConfig

    sent = []

    class Backend:   # a recording double: the grouping, not generation, is under test
        def generate(self, requests, sampling):
            sent.append((len(requests), sampling))
            return [["x"] * r.n for r in requests]

    backend, calls = Backend(), []
    generate = recorded(backend.generate, calls)
    hot, cold = SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.0)
    generate([GenerationRequest([], n=4), GenerationRequest([], n=2)], hot)
    generate([GenerationRequest([], n=1)], cold)
    generate([GenerationRequest([], n=3)], hot)
    sent.clear()
    row = engine_ceiling(backend, calls)
    assert sorted(sent, key=lambda x: x[0]) == [(1, cold), (3, hot)]
    assert row["ceiling_samples"] == 10
