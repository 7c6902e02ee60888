"""Env-server throughput over HTTP: starts the local TextCraft and SciWorld
servers as processes and drives them through the clients, one request at a
time (what one search/eval worker sees). Prints a table.

    .venv/bin/python -m bench.bench_env [--textcraft-steps 3000] [--sciworld-steps 300]
"""
from __future__ import annotations

import argparse
import time


from agentenv_client import SciworldEnvClient, TextCraftEnvClient  # noqa: E402
from tests.support.env_fixtures import start_server, stop_server  # noqa: E402


def rate(n: int, fn) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def bench_textcraft(steps: int) -> list[tuple[str, str, int, float]]:
    proc, url = start_server("agentenv_servers.textcraft")
    try:
        with TextCraftEnvClient(url, 544) as env:
            env.reset(0)
            actions = ["get 1 oak logs", "inventory", "craft 4 oak planks using 1 oak logs", "get 2 nothing"]
            step = rate(steps, lambda i: env.step(actions[i % 4]))
            reset = rate(steps // 5, lambda i: env.reset(i))
        return [("textcraft", "step", steps, step), ("textcraft", "reset", steps // 5, reset)]
    finally:
        stop_server(proc)


def bench_sciworld(steps: int) -> list[tuple[str, str, int, float]]:
    proc, url = start_server("agentenv_servers.sciworld")
    try:
        start = time.perf_counter()
        env = SciworldEnvClient(url, 4639)
        create = 1 / (time.perf_counter() - start)
        with env:
            env.reset(0)
            step = rate(steps, lambda i: env.step("look around"))
            resets = max(steps // 20, 3)
            reset = rate(resets, lambda i: env.reset(i * 37))
            env.reset(0)
            mapped_n = max(steps // 20, 3)
            mapped = rate(mapped_n, lambda i: env.step(env.map_to_valid_action("look around the room")))
        return [("sciworld", "create (JVM start)", 1, create), ("sciworld", "step", steps, step),
                ("sciworld", "reset", resets, reset), ("sciworld", "map_to_valid_action + step", mapped_n, mapped)]
    finally:
        stop_server(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--textcraft-steps", type=int, default=3000)
    parser.add_argument("--sciworld-steps", type=int, default=300)
    args = parser.parse_args()
    rows = bench_textcraft(args.textcraft_steps) + bench_sciworld(args.sciworld_steps)
    print("| env | operation | n | per second |")
    print("|---|---|---:|---:|")
    for env, op, n, per_s in rows:
        print(f"| {env} | {op} | {n} | {per_s:.1f} |")


if __name__ == "__main__":
    main()
