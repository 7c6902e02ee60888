"""The hf backend's key/value reuse between turns: a greedy TextCraft eval
with ``--hf_cache_gib 0`` (every turn prefills its whole conversation) and
with the cache on, same model, same tasks; are the episodes the same, and
how many generated tokens per second each.

    .venv/bin/python -m bench.bench_hf_cache [--model_dir models/smollm2-textcraft-base] [--tasks 8]
        [--task_ids 20,25,30,40] [--max_steps 30] [--concurrency 8] [--device auto]

The env is our TextCraft server over HTTP on 127.0.0.1; the episodes run
to 30 turns (up to ~2k tokens of context), which is where a turn costs its
whole conversation without the cache (``--task_ids 20,25,30,40``: four test
tasks the SmolLM2 base fails, so each episode runs all 30 turns). Generated tokens are the replies
re-tokenized. Off runs first, then on; run it on an otherwise idle machine
for timings.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r.envs import get_env
from agent_r.knobs import BackendSettings
from agent_r.llm import HFBackend
from tests.support.env_fixtures import start_server, stop_server


def run_eval(model_dir: str, cache_gib: float, indices: list[int], url: str, args: argparse.Namespace,
             out: Path) -> tuple[float, int, dict, HFBackend]:
    backend = HFBackend(model_dir, device=args.device, cache_gib=cache_gib, batch_size=args.hf_batch_size)
    split = out / "split.json"
    split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in indices]))
    settings = ev.EvalSettings(task="textcraft", backend=BackendSettings(model_name=f"cache{cache_gib:g}"),
                               model_type="bench", output_dir=str(out / f"cache{cache_gib:g}"), env_server_base=url,
                               split_file=str(split), concurrency=args.concurrency, max_steps=args.max_steps,
                               max_token_length=2048, temperature=0.0, max_new_tokens=100)
    start = time.perf_counter()
    result = ev.evaluate(settings, backend)
    wall = time.perf_counter() - start
    episodes = {}
    for path in sorted(Path(result.run_dir).glob("search_results_*.json")):
        state = json.loads(path.read_text())["state"][conv.HEAD_LEN:]
        episodes[path.name] = [m["content"] for m in state if m["role"] == "assistant"]
    tokens = sum(len(backend.tokenizer(reply, add_special_tokens=False)["input_ids"])
                 for replies in episodes.values() for reply in replies)
    return wall, tokens, episodes, backend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", default="models/smollm2-textcraft-base")
    p.add_argument("--tasks", type=int, default=8, help="the first N test tasks")
    p.add_argument("--task_ids", default="", help="comma list of TextCraft task numbers instead of --tasks")
    p.add_argument("--max_steps", type=int, default=30)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--hf_batch_size", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--cache_gib", type=float, default=4.0)
    args = p.parse_args()
    indices = ([int(i) for i in args.task_ids.split(",")] if args.task_ids
               else get_env("textcraft").split_indices("test")[: args.tasks])
    server, url = start_server("agentenv_servers.textcraft")
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for gib in (0.0, args.cache_gib):
                out = Path(tmp) / f"run{gib:g}"
                out.mkdir()
                rows.append((gib, *run_eval(args.model_dir, gib, indices, url, args, out)))
    finally:
        stop_server(server)
    (_, _, _, base, backend), same = rows[0], 0
    print(f"hf backend, greedy TextCraft eval: {len(indices)} test tasks, {args.max_steps} turns at most, "
          f"concurrency {args.concurrency}, {args.model_dir} ({backend.device}, {backend.dtype})")
    print(f"{'cache GiB':>9}  {'wall s':>7}  {'gen tokens':>10}  {'tokens/s':>8}  {'prompt tokens reused':>20}  "
          f"{'episodes as off':>15}")
    for gib, wall, tokens, episodes, used in rows:
        same = sum(episodes.get(k) == v for k, v in base.items())
        cache = used.prefix_cache
        reused = f"{cache.reused_tokens}/{cache.prompt_tokens}" if cache else "-"
        print(f"{gib:>9g}  {wall:>7.1f}  {tokens:>10}  {tokens / wall:>8.1f}  {reused:>20}  "
              f"{same:>7}/{len(base):<7}")
    if len(rows) == 2:
        print(f"speed-up: {rows[1][1] and rows[0][1] / rows[1][1]:.2f}x wall")


if __name__ == "__main__":
    main()
