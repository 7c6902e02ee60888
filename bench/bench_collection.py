"""Search throughput: the reference's call pattern vs batched trees.

Both runs search the same TextCraft train tasks on a local server with the
same GPU-like latency double (tests.support.doubles.LatencyModelBackend cost
model: per_call + per_token x longest completion of a call):

* reference: one tree at a time, one sample per model call (N_GEN calls of
  n=1 per expansion), as the reference's mcts_collection.py did;
* batched:   --concurrency trees in flight, every pending expansion of all of
  them in one call, n=N_GEN per request.

Sample i of a request is the same text in both runs, so both produce the same
trees (checked) and the difference is pure scheduling.

    .venv/bin/python -m bench.bench_collection --tasks 16 --concurrency 16
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]

from agent_r import envs  # noqa: E402
from agent_r.llm import GenerationRequest, SamplingConfig  # noqa: E402
from agent_r.search import SearchSettings, search_trees  # noqa: E402
from tests.support.doubles import LatencyModelBackend  # noqa: E402
from tests.support.env_fixtures import start_server, stop_server  # noqa: E402
from tests.support.search_doubles import seeded_textcraft_policy  # noqa: E402


class OneSamplePerCallLatencyDouble(LatencyModelBackend):
    """Test double: the reference's pattern - every sample of every request
    is its own model call, paying the per-call latency each time."""

    name = "latency-one-sample-per-call"

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        out = []
        for r in requests:
            texts = []
            for i in range(r.n):
                text = self.policy(r.messages, i, r.seed)
                self.stats.calls += 1
                self.stats.requests += 1
                self.stats.samples += 1
                time.sleep(self.per_call + self.per_token * min(len(text.split()), sampling.max_new_tokens))
                texts.append(text)
            out.append(texts)
        return out


def run(mode: str, indices: list[int], server: str, cfg: SearchSettings, per_call: float, per_token: float) -> dict:
    rules = envs.get_env("textcraft")
    if mode == "reference":
        backend = OneSamplePerCallLatencyDouble(seeded_textcraft_policy, per_call, per_token)
    else:
        backend = LatencyModelBackend(seeded_textcraft_policy, per_call, per_token)
    results = []
    started = time.perf_counter()
    driver = search_trees(indices, rules, lambda: rules.make_client(server), backend, cfg, on_tree=results.append)
    wall = time.perf_counter() - started
    failed = [r.job.idx for r in results if r.error is not None]
    if failed:
        raise SystemExit(f"{mode}: trees failed: {failed}")
    n = len(results)
    return {
        "mode": mode, "concurrency": cfg.concurrency, "trees": n, "wall_s": wall, "trees_per_hour": n / wall * 3600,
        "calls_per_tree": backend.stats.calls / n, "mean_batch": backend.stats.requests / backend.stats.calls,
        "env_steps_per_tree": sum(r.job.stats.env_steps for r in results) / n,
        "samples_per_tree": backend.stats.samples / n,
        "trees_json": {r.job.idx: json.dumps(r.result.to_dict()) for r in results},
        "driver_calls": driver.model_calls,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=16, help="number of TextCraft train tasks (default 16)")
    p.add_argument("--concurrency", type=int, default=16, help="trees in flight in the batched run (default 16)")
    p.add_argument("--itera", type=int, default=4, help="ITERA (default 4)")
    p.add_argument("--n_gen", type=int, default=4, help="N_GEN (default 4)")
    p.add_argument("--max_depth", type=int, default=8, help="MAX_DEPTH (default 8)")
    p.add_argument("--per_call", type=float, default=0.05, help="latency double: seconds per call (default 0.05)")
    p.add_argument("--per_token", type=float, default=0.01, help="latency double: seconds per token step (default 0.01)")
    p.add_argument("--env_server_base", default=None, help="TextCraft server (default: start a local one)")
    args = p.parse_args()

    proc = None
    server = args.env_server_base
    if server is None:
        proc, server = start_server("agentenv_servers.textcraft")
    try:
        indices = envs.get_env("textcraft").split_indices("train")[: args.tasks]
        cfg = dict(max_depth=args.max_depth, iterations=args.itera, n_gen=args.n_gen)
        ref = run("reference", indices, server, SearchSettings(concurrency=1, **cfg), args.per_call, args.per_token)
        bat = run("batched", indices, server, SearchSettings(concurrency=args.concurrency, **cfg), args.per_call,
                  args.per_token)
    finally:
        if proc is not None:
            stop_server(proc)

    same = ref["trees_json"] == bat["trees_json"]
    print(f"TextCraft train tasks {indices[0]}..{indices[-1]} ({len(indices)}), ITERA {args.itera}, N_GEN {args.n_gen}, "
          f"MAX_DEPTH {args.max_depth}; latency double {args.per_call}s/call + {args.per_token}s/token")
    print(f"| {'mode':<9} | conc | trees | wall s | trees/hour | model calls/tree | mean batch | samples/tree | env steps/tree |")
    print("|-----------|------|-------|--------|------------|------------------|------------|--------------|----------------|")
    for r in (ref, bat):
        print(f"| {r['mode']:<9} | {r['concurrency']:>4} | {r['trees']:>5} | {r['wall_s']:>6.1f} | {r['trees_per_hour']:>10.0f} | "
              f"{r['calls_per_tree']:>16.1f} | {r['mean_batch']:>10.2f} | {r['samples_per_tree']:>12.1f} | "
              f"{r['env_steps_per_tree']:>14.1f} |")
    print(f"speed-up (trees/hour): {bat['trees_per_hour'] / ref['trees_per_hour']:.1f}x (target >= 8x); "
          f"identical trees: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
