"""Soak the local TextCraft server: many create / reset / step / close cycles
from 16 client threads, with the server's resident memory, open file
descriptors and live env count recorded at the start, every --sample_s
seconds, and at the end. A leak shows as RSS or fds climbing with the cycles.

    .venv/bin/python -m bench.bench_soak --seconds 600            # own server
    .venv/bin/python -m bench.bench_soak --server_url URL --server_pid PID --seconds 8 --json out.json

"Hours equivalent" divides the requests sent by the request rate of a real
search: 16 trees of an 8B model on one GPU (vLLM, 500-token turns, ~15 s per
batched round) issue about 472 env steps per tree (bench_collection) over
~500 s per 16 trees, i.e. ~15-20 env requests/s; --real_rate (default 18)
sets it. The soak runs far faster than that, so minutes here stand for hours.
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path


from agentenv_client import EnvServerError, TextCraftEnvClient  # noqa: E402
from tests.support.env_fixtures import rss_kib, start_server, stop_server  # noqa: E402
from tests.support.faults import live_envs, open_fds  # noqa: E402

ACTIONS = ["inventory", "get 1 oak logs", "craft 4 oak planks using 1 oak logs", "get 2 nothing", "craft 1 stick"]


def sample(url: str, pid: int, started: float, requests_sent: int) -> dict:
    return {"t_s": round(time.monotonic() - started, 1), "requests": requests_sent, "rss_kib": rss_kib(pid),
            "fds": open_fds(pid), "live_envs": live_envs(url)}


def soak(url: str, pid: int, seconds: float, concurrency: int, steps: int, sample_s: float) -> dict:
    """Cycles until ``seconds`` have passed; returns counts and samples."""
    counts = {"cycles": 0, "requests": 0, "errors": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                with TextCraftEnvClient(url, 544) as env:       # create ... close, also on errors
                    env.reset(rng.randrange(544))
                    for _ in range(steps):
                        env.step(rng.choice(ACTIONS))
                n = 3 + steps                                   # create, reset, steps, close
                with lock:
                    counts["cycles"] += 1
                    counts["requests"] += n
            except EnvServerError:
                with lock:
                    counts["errors"] += 1

    started = time.monotonic()
    samples = [sample(url, pid, started, 0)]
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    deadline = started + seconds
    while time.monotonic() < deadline:
        time.sleep(min(sample_s, max(0.0, deadline - time.monotonic())))
        samples.append(sample(url, pid, started, counts["requests"]))
    stop.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    end = sample(url, pid, started, counts["requests"])
    return {**counts, "seconds": round(wall, 1), "concurrency": concurrency, "steps_per_cycle": steps,
            "requests_per_s": round(counts["requests"] / wall, 1), "start": samples[0], "end": end,
            "samples": samples + [end]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="soak duration (default 30)")
    p.add_argument("--concurrency", type=int, default=16, help="client threads (default 16)")
    p.add_argument("--steps", type=int, default=10, help="steps per create/reset/close cycle (default 10)")
    p.add_argument("--sample_s", type=float, default=None, help="seconds between samples (default seconds/10)")
    p.add_argument("--server_url", default=None, help="soak this server (default: start one)")
    p.add_argument("--server_pid", type=int, default=None, help="its process id (needed with --server_url)")
    p.add_argument("--real_rate", type=float, default=18.0, help="env requests/s of a real search (default 18)")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args()
    if (args.server_url is None) != (args.server_pid is None):
        p.error("give --server_url and --server_pid together (or neither, to start a server)")
    proc = None
    url, pid = args.server_url, args.server_pid
    if url is None:
        proc, url = start_server("agentenv_servers.textcraft")
        pid = proc.pid
    try:
        res = soak(url, pid, args.seconds, args.concurrency, args.steps, args.sample_s or args.seconds / 10)
    finally:
        if proc is not None:
            stop_server(proc)
    res["hours_equivalent"] = round(res["requests"] / args.real_rate / 3600, 2)
    print("| t s | requests | server RSS MiB | open fds | live envs |")
    print("|---:|---:|---:|---:|---:|")
    for s in res["samples"]:
        print(f"| {s['t_s']} | {s['requests']} | {s['rss_kib'] / 1024:.1f} | {s['fds']} | {s['live_envs']} |")
    print(f"\n{res['cycles']} cycles, {res['requests']} requests in {res['seconds']} s "
          f"({res['requests_per_s']} req/s, concurrency {res['concurrency']}), {res['errors']} errors; "
          f"RSS {res['start']['rss_kib'] / 1024:.1f} -> {res['end']['rss_kib'] / 1024:.1f} MiB, "
          f"fds {res['start']['fds']} -> {res['end']['fds']}; = {res['hours_equivalent']} h of a real search "
          f"at {args.real_rate:g} req/s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
