"""Sampled eval throughput: K episodes per task in one run (``eval.py
--samples K``) against K separate one-episode runs with K seeds, the way
Pass@k was measured before ``--samples`` existed.

    .venv/bin/python -m bench.bench_passk [--model_dir models/textcraft-base] [--backend hf]
    .venv-vllm/bin/python -m bench.bench_passk --model_dir models/smollm2-textcraft-base --backend vllm

A real model on the real TextCraft server (started here on 127.0.0.1); both
modes play the same number of episodes at the same concurrency on one
loaded engine (its load is not timed). In one run the K episodes of a task
start together, so each batch holds several copies of the same prompt:
vLLM's prefix cache computes it once; the hf backend gains only from fuller
batches at the end of each run.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agent_r import evaluation as ev
from agent_r.envs import get_env
from agent_r.knobs import BackendSettings
from agent_r.llm import make_backend
from tests.support.env_fixtures import start_server, stop_server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", default="models/textcraft-base")
    p.add_argument("--backend", default="hf", help="hf or vllm")
    p.add_argument("--tasks", type=int, default=16, help="the first N test tasks")
    p.add_argument("--samples", type=int, default=8, help="K")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--max_new_tokens", type=int, default=60)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max_token_length", type=int, default=2048)
    args = p.parse_args()

    indices = get_env("textcraft").split_indices("test")[: args.tasks]
    settings = BackendSettings(model_dir=args.model_dir, backend=args.backend, allow_cpu=True)
    backend = make_backend(settings, max_model_len=args.max_token_length + args.max_new_tokens)
    server, url = start_server("agentenv_servers.textcraft")
    try:
        rows = run_both(args, indices, url, backend, settings)
    finally:
        stop_server(server)
        backend.close()
    print_table(args, backend.describe(), rows)


def run_both(args: argparse.Namespace, indices: list[int], url: str, backend, settings: BackendSettings) -> list:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        split = Path(tmp) / "split.json"
        split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in indices]))

        def run(label: str, samples: int, seed: int) -> dict:
            es = ev.EvalSettings(task="textcraft", backend=settings, model_type=label, output_dir=tmp,
                                 env_server_base=url, split_file=str(split), concurrency=args.concurrency,
                                 max_steps=args.max_steps, max_new_tokens=args.max_new_tokens, seed=seed,
                                 temperature=args.temperature, max_token_length=args.max_token_length,
                                 eval_samples=samples)
            return ev.evaluate(es, backend).summary

        for mode in ("one run, --samples K", "K runs of one episode"):
            calls, start = backend.stats.calls, time.perf_counter()
            if mode.startswith("one"):
                episodes = run("sampled", args.samples, 0)["episodes"]
            else:
                episodes = sum(run(f"seed{j}", 1, j)["tasks"] for j in range(args.samples))
            wall = time.perf_counter() - start
            rows.append((mode, episodes, wall, 3600 * episodes / wall, backend.stats.calls - calls))
    return rows


def print_table(args: argparse.Namespace, described: dict, rows: list) -> None:
    print(f"TextCraft, first {args.tasks} test tasks x K={args.samples} episodes, TEMP {args.temperature:g}, "
          f"concurrency {args.concurrency}, at most {args.max_steps} turns of {args.max_new_tokens} tokens; "
          f"{described.get('backend')} {Path(args.model_dir).name} ({described.get('dtype')})")
    print(f"{'mode':<24}  {'episodes':>8}  {'wall s':>8}  {'episodes/h':>10}  {'model calls':>11}")
    for mode, n, wall, eph, calls in rows:
        print(f"{mode:<24}  {n:>8}  {wall:>8.1f}  {eph:>10.0f}  {calls:>11}")
    print(f"speed-up of one run: {rows[0][3] / rows[1][3]:.2f}x")


if __name__ == "__main__":
    main()
