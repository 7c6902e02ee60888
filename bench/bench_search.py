"""Tree search throughput on CPU: the hf backend vs vLLM's CPU engine, at the
paper's search settings (ITERA 8, N_GEN 4, MAX_DEPTH 20, TEMP 1, c 0.25), on
a few TextCraft train tasks spread over the project split.

One configuration per command; each appends one JSON row to --out, and
--table prints the rows as a markdown table:

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_search.py --backend hf --out runs/bench_search.jsonl
    .venv-vllm/bin/python bench/bench_search.py --backend vllm --dtype float32 --out runs/bench_search.jsonl
    # the engine's threads on core 1, env server + driver pinned to core 0:
    .venv-vllm/bin/python bench/bench_search.py --backend vllm --dtype float32 --pin --out ...
    # two processes (shards), one engine bound to each core, one env server:
    .venv-vllm/bin/python bench/bench_search.py --backend vllm --dtype float32 --shards 2 --out ...
    # and the engine alone: the same requests sent again as one batch (the search's ceiling)
    .venv-vllm/bin/python -m bench.bench_search --backend vllm --model_dir DIR --ceiling --out ...
    .venv/bin/python bench/bench_search.py --table runs/bench_search.jsonl

Equivalence of two backends, from finished runs (no model needed):

    # greedy eval folders (eval.py --output_dir ...): identical episodes, first differing turn
    .venv/bin/python bench/bench_search.py --compare_episodes DIR_A DIR_B
    # sampled search folders (mcts_collection.py --output_dir ...): success-leaf rate and tree
    # size, two-proportion z-test and Mann-Whitney U (normal approximation, ties corrected)
    .venv/bin/python bench/bench_search.py --compare_trees DIR_A DIR_B

Where the search's wall time goes (engine start excluded, reported apart):
* generation: inside ``backend.generate``; for vLLM also the part of it spent
  rendering and tokenizing prompts in the driver's process ("of which prompts");
* env: while at least one env HTTP request is in flight (the union of the
  requests' intervals over the driver's env threads);
* driver: the rest (search logic, prompt truncation, thread hand-offs).
CPU seconds per process (driver, vLLM's engine processes, env server) show
who competes for the two cores. vLLM's prefix-cache hit rate is its own token
counter (vllm:prefix_cache_hits / vllm:prefix_cache_queries) from
``LLM.get_metrics()``; the bench turns vLLM's stat logging on for that.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("bench_search")

COLUMNS = [("label", "run"), ("load", "load (1 min, start/end)"), ("trees", "trees"), ("samples", "samples"),
           ("wall_s", "search s"), ("start_s", "engine start s"), ("samples_per_s", "samples/s"),
           ("trees_per_hour", "trees/h"), ("samples_per_cpu_s", "samples/CPU-s"), ("gen_pct", "generation %"),
           ("prompt_pct", "of which prompts %"), ("ceiling_samples_per_s", "engine alone samples/s"),
           ("search_vs_ceiling_pct", "search / engine alone %"),
           ("env_pct", "env %"), ("driver_pct", "driver %"), ("prefix_hit_pct", "prefix-cache hits %"),
           ("env_requests", "env requests"), ("env_steps", "env steps"), ("cpu", "CPU s driver/engine/env")]


def spread_tasks(count: int) -> list[int]:
    """``count`` train tasks of the project split spread over it (and so over recipe depths)."""
    from agent_r import envs

    train = envs.get_env("textcraft").named_split("project").indices("train", "textcraft")
    step = max(1, len(train) // count)
    return train[::step][:count]


class Intervals:
    """Wall-clock intervals of calls made from any thread; ``covered()`` is
    the length of their union."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.spans.append((start, time.perf_counter()))
        return timed

    def covered(self) -> float:
        total, end = 0.0, float("-inf")
        for a, b in sorted(self.spans):
            if b <= end:
                continue
            total += b - max(a, end)
            end = b
        return total


def cpu_seconds(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def start_env_server(pin: set[int] | None) -> tuple[subprocess.Popen, str]:
    from tests.support.env_fixtures import start_server

    proc, url = start_server("agentenv_servers.textcraft")
    if pin:
        os.sched_setaffinity(proc.pid, pin)
    return proc, url


def enable_vllm_stats() -> None:
    """vllm.LLM turns stat logging off unless told; the prefix-cache counters need it on."""
    import vllm

    base = vllm.LLM

    class LLMWithStats(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("disable_log_stats", False)
            super().__init__(*args, **kwargs)

    vllm.LLM = LLMWithStats


def prefix_hit_rate(backend) -> float | None:
    llm = getattr(backend, "llm", None)
    if llm is None:
        return None
    got = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    queries, hits = got.get("vllm:prefix_cache_queries"), got.get("vllm:prefix_cache_hits")
    return hits / queries if queries else None


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One search in this process: the row of measurements."""
    import psutil

    from agent_r import envs
    from agent_r.knobs import BackendSettings
    from agent_r.llm import make_backend
    from agent_r.search import SearchSettings, search_trees
    from agentenv_client.base import BaseEnvClient

    spec = envs.get_env("textcraft")
    tasks = spread_tasks(args.tasks)[args.shard_index::args.num_shards]
    load_start = os.getloadavg()[0]
    server = None
    url = args.env_server_base
    if url is None:
        server, url = start_env_server({0} if args.pin else None)
    settings = SearchSettings(task="textcraft", iterations=args.itera, n_gen=args.n_gen, max_depth=args.max_depth,
                              temperature=args.temp, c=args.c, max_new_tokens=args.max_new_tokens, seed=args.seed,
                              concurrency=args.concurrency, max_token_length=args.max_token_length)
    if args.backend == "vllm":
        enable_vllm_stats()
    started = time.perf_counter()
    backend = make_backend(BackendSettings(backend=args.backend, dtype=args.dtype, hf_batch_size=args.hf_batch_size,
                                           model_dir=args.model_dir),
                           seed=args.seed, max_model_len=args.max_token_length + args.max_new_tokens)
    start_s = time.perf_counter() - started
    if args.pin:   # after the engine exists: its processes keep their own binding
        os.sched_setaffinity(0, {0})

    generation, prompts, env = Intervals(), Intervals(), Intervals()
    calls: list = []
    if args.ceiling:
        backend.generate = recorded(backend.generate, calls)
    backend.generate = generation.wrap(backend.generate)
    if hasattr(backend, "_prompt_ids"):
        backend._prompt_ids = prompts.wrap(backend._prompt_ids)
    BaseEnvClient._request = env.wrap(BaseEnvClient._request)

    me = psutil.Process()
    engine = [p for p in me.children(recursive=True) if server is None or p.pid != server.pid]
    env_proc = psutil.Process(server.pid) if server is not None else None
    cpu0 = (cpu_seconds(me), sum(cpu_seconds(p) for p in engine), cpu_seconds(env_proc) if env_proc else 0.0)
    per_proc0 = {p.pid: cpu_seconds(p) for p in engine}
    results: list = []
    t0, wall0 = time.perf_counter(), time.time()
    search_trees(tasks, spec, lambda: spec.make_client(url, replay=not args.no_replay), backend, settings,
                 on_tree=results.append)
    wall = time.perf_counter() - t0
    cpu1 = (cpu_seconds(me), sum(cpu_seconds(p) for p in engine), cpu_seconds(env_proc) if env_proc else 0.0)
    engine_cpu = {f"{p.name()} {p.pid}": round(cpu_seconds(p) - per_proc0[p.pid], 1) for p in engine}
    failed = [r.job.idx for r in results if r.error is not None]
    if failed:
        raise SystemExit(f"trees failed: {failed}: {[str(r.error) for r in results if r.error][:3]}")
    stats = [r.job.stats for r in results]
    samples = sum(s.samples for s in stats)
    gen, env_s = generation.covered(), env.covered()
    row = {
        "label": args.label or args.backend, "backend": args.backend, "dtype": getattr(backend, "dtype", args.dtype),
        "tasks": tasks, "trees": len(results), "samples": samples, "wall_s": round(wall, 1),
        "wall_start": wall0, "wall_end": wall0 + wall, "start_s": round(start_s, 1),
        "gen_s": round(gen, 1), "prompt_s": round(prompts.covered(), 1) if prompts.spans else None,
        "env_s": round(env_s, 1),
        "driver_s": round(wall - gen - env_s, 1), "prefix_hit": prefix_hit_rate(backend),
        "env_requests": sum(s.env_requests for s in stats), "env_steps": sum(s.env_steps for s in stats),
        "nodes": sum(s.nodes for s in stats), "successful_leaves": sum(s.successful_leaves for s in stats),
        "leaves": sum(s.leaves for s in stats),
        "cpu_driver_s": round(cpu1[0] - cpu0[0], 1), "cpu_engine_s": round(cpu1[1] - cpu0[1], 1),
        "cpu_env_s": round(cpu1[2] - cpu0[2], 1), "cpu_engine_processes": engine_cpu,
        "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "settings": {k: getattr(args, k) for k in ("itera", "n_gen", "max_depth", "temp", "c", "max_new_tokens",
                                                   "concurrency", "seed", "no_replay", "pin")},
        "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    if args.ceiling:
        row.update(engine_ceiling(backend, calls))
        row["search_vs_ceiling_pct"] = round(100 * (samples / wall) / row["ceiling_samples_per_s"])
    backend.close()
    if server is not None:
        from tests.support.env_fixtures import stop_server

        stop_server(server)
    return finish(row)


def recorded(generate, calls: list):
    """``generate`` that also keeps every call's (requests, sampling), for the ceiling."""
    def keep(requests, sampling):
        calls.append((list(requests), sampling))
        return generate(requests, sampling)
    return keep


def engine_ceiling(backend, calls: list) -> dict[str, Any]:
    """The search's own generation requests (same prompts, n, seeds and
    sampling) sent again as one batch per sampling setting, with nothing
    else running: the samples/s the engine gives when it never waits for the
    search, the env server or a small batch. vLLM's prefix cache is emptied
    first, so the search's own cached prompts do not make the ceiling look
    higher; within the batch prompts still share prefixes, as in the search."""
    llm = getattr(backend, "llm", None)
    if llm is not None and hasattr(llm, "reset_prefix_cache"):
        llm.reset_prefix_cache()
    groups: dict[Any, list] = {}
    for requests, sampling in calls:
        groups.setdefault(sampling, []).extend(requests)
    samples, start = 0, time.perf_counter()
    for sampling, requests in groups.items():
        samples += sum(len(r) for r in backend.generate(requests, sampling) if isinstance(r, list))
    wall = time.perf_counter() - start
    return {"ceiling_samples": samples, "ceiling_s": round(wall, 1),
            "ceiling_samples_per_s": round(samples / wall, 1) if wall else None}


def finish(row: dict[str, Any]) -> dict[str, Any]:
    wall = row["wall_s"]
    row["samples_per_s"] = round(row["samples"] / wall, 1)
    row["trees_per_hour"] = round(row["trees"] * 3600 / wall)
    for key in ("gen", "prompt", "env", "driver"):
        row[f"{key}_pct"] = None if row[f"{key}_s"] is None else round(100 * row[f"{key}_s"] / wall)
    row["prefix_hit_pct"] = None if row.get("prefix_hit") is None else round(100 * row["prefix_hit"], 1)
    row["cpu"] = f"{row['cpu_driver_s']}/{row['cpu_engine_s']}/{row['cpu_env_s']}"
    cpu = row["cpu_driver_s"] + row["cpu_engine_s"] + row["cpu_env_s"]
    row["samples_per_cpu_s"] = round(row["samples"] / cpu, 1) if cpu else None
    return row


def run_shards(args: argparse.Namespace) -> dict[str, Any]:
    """``--shards N``: N processes of this script, shard i's engine bound to
    core i, one env server for all; the row adds them up over the span from
    the first start to the last end."""
    from tests.support.env_fixtures import start_server, stop_server
    import psutil

    server, url = start_server("agentenv_servers.textcraft")
    load_start = os.getloadavg()[0]
    env_cpu0 = cpu_seconds(psutil.Process(server.pid))
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i in range(args.shards):
            cmd = [sys.executable, __file__, *shard_argv(args), "--shard_index", str(i), "--num_shards",
                   str(args.shards), "--env_server_base", url, "--out", f"{tmp}/shard{i}.jsonl"]
            env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(i % os.cpu_count())}
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a shard failed: exit codes {codes}")
        rows = [json.loads(Path(f"{tmp}/shard{i}.jsonl").read_text()) for i in range(args.shards)]
    env_cpu = cpu_seconds(psutil.Process(server.pid)) - env_cpu0
    stop_server(server)
    wall = max(r["wall_end"] for r in rows) - min(r["wall_start"] for r in rows)
    row = {"label": args.label or f"{args.backend} x{args.shards} shards", "backend": args.backend,
           "dtype": rows[0]["dtype"], "tasks": sorted(t for r in rows for t in r["tasks"]),
           "wall_s": round(wall, 1), "start_s": max(r["start_s"] for r in rows),
           "prefix_hit": (sum(r["prefix_hit"] for r in rows) / len(rows)
                          if rows[0]["prefix_hit"] is not None else None),
           "load": [round(load_start, 2), round(os.getloadavg()[0], 2)], "settings": rows[0]["settings"],
           "shards": rows}
    for key in ("trees", "samples", "env_requests", "env_steps", "nodes", "successful_leaves", "leaves",
                "cpu_driver_s", "cpu_engine_s"):
        row[key] = round(sum(r[key] for r in rows), 1)
    # time shares: the shards' own shares, weighted by their walls
    for key in ("gen_s", "prompt_s", "env_s", "driver_s"):
        parts = [r[key] for r in rows if r[key] is not None]
        row[key] = round(sum(parts) * wall / sum(r["wall_s"] for r in rows), 1) if parts else None
    row["cpu_env_s"] = round(env_cpu, 1)
    return finish(row)


def shard_argv(args: argparse.Namespace) -> list[str]:
    out = ["--backend", args.backend, "--dtype", args.dtype, "--tasks", str(args.tasks), "--itera", str(args.itera),
           "--n_gen", str(args.n_gen), "--max_depth", str(args.max_depth), "--temp", str(args.temp), "--c", str(args.c),
           "--max_new_tokens", str(args.max_new_tokens), "--concurrency", str(args.concurrency), "--seed",
           str(args.seed), "--max_token_length", str(args.max_token_length), "--hf_batch_size", str(args.hf_batch_size)]
    return out + (["--no_replay"] if args.no_replay else [])


def table(path: str) -> str:
    rows = [finish(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "|".join("---" if key == "label" else "---:" for key, _ in COLUMNS) + "|"]
    for row in rows:
        cells = []
        for key, _ in COLUMNS:
            value = row.get(key)
            if key == "load":
                value = f"{value[0]} / {value[1]}"
            elif key == "start_s" and row["backend"] == "hf":
                value = f"{value} (load)"
            text = "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
            cells.append(text.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- equivalence of two runs ---------------------------------------------------

def normal_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2))


def two_proportion_p(x1: int, n1: int, x2: int, n2: int) -> float:
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    return 1.0 if se == 0 else normal_p((x1 / n1 - x2 / n2) / se)


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided Mann-Whitney U test, normal approximation with tie and continuity corrections."""
    values = sorted((v, i) for i, v in enumerate(a + b))
    ranks, ties, k = [0.0] * len(values), 0.0, 0
    while k < len(values):
        j = k
        while j + 1 < len(values) and values[j + 1][0] == values[k][0]:
            j += 1
        for m in range(k, j + 1):
            ranks[values[m][1]] = (k + j) / 2 + 1
        t = j - k + 1
        ties += t ** 3 - t
        k = j + 1
    n1, n2 = len(a), len(b)
    n = n1 + n2
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var == 0:
        return 1.0
    diff = u - n1 * n2 / 2
    return normal_p((abs(diff) - 0.5) / math.sqrt(var) if diff else 0.0)


def result_files(folder: str) -> dict[int, Path]:
    files = {int(f.stem.rsplit("_", 1)[1]): f for f in Path(folder).rglob("search_results_*.json")}
    if not files:
        raise SystemExit(f"no search_results_*.json under {folder}")
    return files


def compare_episodes(a_dir: str, b_dir: str) -> str:
    """Greedy episodes of two backends: how many are identical (messages,
    score, steps), and for the others the first assistant turn that differs."""
    a_files, b_files = result_files(a_dir), result_files(b_dir)
    common = sorted(set(a_files) & set(b_files))
    same, lines = 0, []
    for idx in common:
        a, b = (json.loads(f.read_text()) for f in (a_files[idx], b_files[idx]))
        if (a["state"], a["env_score"], a["step_num"]) == (b["state"], b["env_score"], b["step_num"]):
            same += 1
            continue
        turn = next((i for i, (x, y) in enumerate(zip(a["state"], b["state"])) if x != y),
                    min(len(a["state"]), len(b["state"])))
        model_turn = sum(1 for m in a["state"][:turn + 1] if m["role"] == "assistant") - 1   # "Ok." is turn 0
        show = lambda st: repr(st[turn]["content"][:90]) if turn < len(st) else "(ended)"  # noqa: E731
        lines.append(f"| {idx} | {model_turn} | {a['env_score']} / {b['env_score']} | {show(a['state'])} | "
                     f"{show(b['state'])} |")
    solved = [sum(json.loads(files[i].read_text())["env_score"] >= 1.0 for i in common) for files in (a_files, b_files)]
    head = (f"{same} of {len(common)} episodes identical ({len(a_files)} vs {len(b_files)} files); "
            f"solved: {solved[0]} vs {solved[1]}")
    if not lines:
        return head
    return "\n".join([head, "", "| task | first differing model turn | score a / b | a | b |",
                      "|---:|---:|---|---|---|",
                      *lines])


def tree_counts(folder: str) -> list[tuple[int, int, int]]:
    """(nodes, leaves, successful leaves) of every tree, counted as the search's stats count them."""
    from agent_r.tree import load_tree

    out = []
    for _, path in sorted(result_files(folder).items()):
        root = load_tree(path)
        nodes = list(root.iter_nodes())
        leaves = [n for n in nodes if n is not root and n.is_terminal and not n.children]
        out.append((len(nodes), len(leaves), sum(1 for n in leaves if n.env_score >= 1.0)))
    return out


def compare_trees(a_dir: str, b_dir: str) -> str:
    a, b = tree_counts(a_dir), tree_counts(b_dir)
    rows = []
    for name, t in ((a_dir, a), (b_dir, b)):
        leaves, good = sum(x[1] for x in t), sum(x[2] for x in t)
        rows.append(f"| {name} | {len(t)} | {sum(x[0] for x in t) / len(t):.1f} | {leaves} | {good} | "
                    f"{100 * good / max(leaves, 1):.1f} | {sum(1 for x in t if x[2]) } |")
    frac = lambda t: [x[2] / x[1] if x[1] else 0.0 for x in t]  # noqa: E731
    tests = [
        ("success-leaf rate, pooled leaves (two-proportion z)",
         two_proportion_p(sum(x[2] for x in a), sum(x[1] for x in a), sum(x[2] for x in b), sum(x[1] for x in b))),
        ("per-tree success-leaf fraction (Mann-Whitney U)", mann_whitney_p(frac(a), frac(b))),
        ("trees with a successful leaf (two-proportion z)",
         two_proportion_p(sum(1 for x in a if x[2]), len(a), sum(1 for x in b if x[2]), len(b))),
        ("tree size, nodes (Mann-Whitney U)", mann_whitney_p([x[0] for x in a], [x[0] for x in b])),
    ]
    return "\n".join(["| run | trees | mean nodes | leaves | successful leaves | success-leaf % "
                      "| trees with a success |",
                      "|---|---:|---:|---:|---:|---:|---:|", *rows, "", "| test | p |", "|---|---:|",
                      *(f"| {name} | {p:.3f} |" for name, p in tests)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="hf", help="hf or vllm (default hf)")
    p.add_argument("--model_dir", default=None, help="the model searched with (default: the bundled model)")
    p.add_argument("--dtype", default="float32", help="weights dtype (default float32)")
    p.add_argument("--tasks", type=int, default=8, help="train tasks, spread over the split (default 8)")
    p.add_argument("--itera", type=int, default=8)
    p.add_argument("--n_gen", type=int, default=4)
    p.add_argument("--max_depth", type=int, default=20)
    p.add_argument("--temp", type=float, default=1.0)
    p.add_argument("--c", type=float, default=0.25)
    p.add_argument("--max_new_tokens", type=int, default=60)
    p.add_argument("--max_token_length", type=int, default=4096)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf_batch_size", type=int, default=0, help="hf: sequences per generate call (0: its default)")
    p.add_argument("--no_replay", action="store_true", help="replay with reset + step requests (no POST /replay)")
    p.add_argument("--pin", action="store_true", help="vllm: engine threads on core 1 (VLLM_CPU_OMP_THREADS_BIND=1), "
                   "env server and driver on core 0")
    p.add_argument("--ceiling", action="store_true", help="after the search, send its generation requests again "
                   "as one batch: the engine's pure-generation samples/s, and the search's share of it")
    p.add_argument("--shards", type=int, default=1, help="processes, shard i's engine on core i (default 1)")
    p.add_argument("--shard_index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--num_shards", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--env_server_base", default=None, help="use this TextCraft server (default: start one)")
    p.add_argument("--label", default=None)
    p.add_argument("--out", default=None, help="append the row (JSON) to this file")
    p.add_argument("--table", default=None, metavar="JSONL", help="print the rows of this file as a markdown table")
    p.add_argument("--compare_episodes", nargs=2, metavar="DIR", help="greedy eval folders of two backends")
    p.add_argument("--compare_trees", nargs=2, metavar="DIR", help="search folders of two backends")
    args = p.parse_args()
    if args.table or args.compare_episodes or args.compare_trees:
        print(table(args.table) if args.table else compare_episodes(*args.compare_episodes) if args.compare_episodes
              else compare_trees(*args.compare_trees))
        return
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"), format="%(asctime)s %(name)s: %(message)s")
    if args.pin:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "1"
    row = run_shards(args) if args.shards > 1 else run_one(args)
    line = json.dumps(row)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    print(json.dumps({k: row[k] for k, _ in COLUMNS if k in row}))


if __name__ == "__main__":
    main()
