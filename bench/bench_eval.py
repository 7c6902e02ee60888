"""Evaluation throughput: episodes/hour at concurrency 1 vs 16 on TextCraft.

    .venv/bin/python -m bench.bench_eval [--tasks 64] [--per_call 0.05] [--per_token 0.01]

The model is LatencyModelBackend (a test double that sleeps like a GPU server:
a batched call costs about as much as a single one) following the TextCraft
expert's plan, so the episodes are real and solved; the env is our TextCraft
server over HTTP on 127.0.0.1. What it measures is the scheduler: how much of
the model latency concurrent, batched episodes hide.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from agent_r import conversation as conv  # noqa: E402
from agent_r import evaluation as ev  # noqa: E402
from agent_r.envs import get_env  # noqa: E402
from agent_r.knobs import BackendSettings  # noqa: E402
from agentenv_servers.textcraft_expert import solve  # noqa: E402
from tests.support.doubles import LatencyModelBackend  # noqa: E402
from tests.support.env_fixtures import start_server, stop_server  # noqa: E402


def expert_policy(messages: list[dict], i: int, seed: int | None) -> str:
    plan = solve(messages[conv.HEAD_LEN - 1]["content"])
    k = sum(1 for m in messages[conv.HEAD_LEN:] if m["role"] == "assistant")
    return plan.steps[k].turn() if k < len(plan.steps) else "Thought: check.\nAction: inventory"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--per_call", type=float, default=0.05)
    p.add_argument("--per_token", type=float, default=0.01)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = p.parse_args()

    indices = get_env("textcraft").split_indices("test")[: args.tasks]
    server, url = start_server("agentenv_servers.textcraft")
    try:
        rows = run_all(args, indices, url)
    finally:
        stop_server(server)
    print_table(args, indices, rows)


def run_all(args: argparse.Namespace, indices: list[int], url: str) -> list[tuple]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        split = Path(tmp) / "split.json"
        split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in indices]))
        for conc in args.concurrency:
            backend = LatencyModelBackend(expert_policy, per_call=args.per_call, per_token=args.per_token)
            settings = ev.EvalSettings(task="textcraft", backend=BackendSettings(model_name="latency"),
                                       model_type=f"c{conc}", output_dir=tmp, env_server_base=url,
                                       split_file=str(split), concurrency=conc, max_steps=40, max_token_length=100000)
            start = time.perf_counter()
            summary = ev.evaluate(settings, backend).summary
            wall = time.perf_counter() - start
            rows.append((conc, summary["tasks"], summary["score_x100"], wall, 3600 * summary["tasks"] / wall,
                         backend.stats.calls, backend.stats.requests / max(1, backend.stats.calls)))
    return rows


def print_table(args: argparse.Namespace, indices: list[int], rows: list[tuple]) -> None:
    print(f"TextCraft eval, {len(indices)} test tasks, LatencyModelBackend per_call={args.per_call}s "
          f"per_token={args.per_token}s, expert policy")
    print(f"{'concurrency':>11}  {'episodes':>8}  {'score x100':>10}  {'wall s':>7}  {'episodes/h':>10}  "
          f"{'model calls':>11}  {'mean batch':>10}")
    for conc, n, score, wall, eph, calls, batch in rows:
        print(f"{conc:>11}  {n:>8}  {score:>10.1f}  {wall:>7.2f}  {eph:>10.0f}  {calls:>11}  {batch:>10.2f}")
    if len(rows) >= 2:
        print(f"speed-up concurrency {rows[-1][0]} vs {rows[0][0]}: {rows[-1][4] / rows[0][4]:.1f}x")


if __name__ == "__main__":
    main()
