"""Search one MCTS tree per training task and dump it as JSON (SPEC section 3).

    TASK=textcraft MAX_DEPTH=20 ITERA=8 N_GEN=4 python mcts_collection.py \\
        --env_server_base http://127.0.0.1:36001 --min 0 --max 100

Trees go to {output_dir}/{TASK}/{model_name}/search_results_{idx}.json, the
run manifest to manifest.json beside them. Rerunning the same command resumes.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import requests
from tqdm import tqdm

from agent_r import tasks
from agent_r.config import UsageError, env_float, env_int, env_str, run_cli, setup_logging
from agent_r.io import atomic_write_json
from agent_r.llm import DEFAULT_MAX_NEW_TOKENS, make_backend, output_model_name
from agent_r.manifest import write_manifest
from agent_r.search import SearchConfig, TreeResult, search_trees
from agent_r.tree import TreeFormatError, load_tree

log = logging.getLogger("mcts_collection")

# No published MAX_DEPTH: about the step budget a solved episode needs, per task.
DEFAULT_MAX_DEPTH = {"textcraft": 20, "sciworld": 30, "webshop": 10}

ENV_HELP = """environment variables (meaning, default):
  TASK              environment: textcraft, sciworld or webshop (default textcraft, the bundled demo)
  MAX_DEPTH         a node deeper than this is terminal (default textcraft 20, sciworld 30, webshop 10)
  ITERA             search iterations per tree (default 8)
  N_GEN             model samples per expansion, one request with n=N_GEN (default 4)
  TEMP              sampling temperature, float (default 1.0)
  MAX_TOKEN_LENGTH  prompt budget in tokens; older turns are dropped above it - 60 (default 4096)
  MODEL_DIR         policy model directory or hub id (default: the bundled models/textcraft-tiny)
  MODEL_NAME        output folder name when --model_name is not given (default: basename of MODEL_DIR)
  BACKEND           model backend when --backend is not given: vllm, hf, openai, python:MOD:FACTORY
                    (default vllm when installed with CUDA, else hf)
  OPENAI_BASE_URL / OPENAI_API_KEY   endpoint for BACKEND=openai
  LOGLEVEL          logging level (default INFO)

Results do not depend on --concurrency with a backend whose samples depend only on
each request's seed (vllm, greedy decoding, scripted doubles); hf sampling at TEMP>0
is seeded per batch, so it is reproducible only at the same concurrency.
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Run MCTS on training tasks and save one tree per task (Agent-R step 1).",
        epilog=ENV_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--env_server_base", default=None, help="env server URL (default: the task's local server, e.g. http://127.0.0.1:36001 for textcraft)")
    p.add_argument("--model_name", default=None, help="output folder name (default MODEL_NAME, else basename of MODEL_DIR)")
    p.add_argument("--min", type=int, default=0, help="textcraft/webshop: lowest task index searched; sciworld: first position in the task-number list (default 0)")
    p.add_argument("--max", type=int, default=None, help="textcraft/webshop: task indices < MAX; sciworld: position end in the task-number list (default: no limit)")
    p.add_argument("--task_num", type=int, default=None, help="sciworld: search only this task number (position in ScienceWorld's task-name list); default all 23 training task numbers")
    p.add_argument("--task_iteration", type=int, default=5, help="sciworld: variations per task number, positions 1..N of its list (default 5)")
    p.add_argument("--output_dir", default="mcts_result", help="root of the output tree (default mcts_result)")
    p.add_argument("--split_file", default=None, help="AgentGym task list to search instead of the bundled train split (required for webshop)")
    p.add_argument("--concurrency", type=int, default=8, help="trees searched at once; their expansions share one model call (default 8; results do not depend on it)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling and tie-breaking (default 0)")
    p.add_argument("--backend", default=None, help="vllm | hf | openai | python:MODULE:FACTORY (default: env BACKEND, else vllm if usable, else hf)")
    p.add_argument("--max_new_tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help=f"token limit of one model turn (default {DEFAULT_MAX_NEW_TOKENS})")
    args = p.parse_args(argv)
    for name in ("concurrency", "task_iteration", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1 (got {getattr(args, name)})")
    return args


def search_config(task: str, args: argparse.Namespace) -> SearchConfig:
    return SearchConfig(
        max_depth=env_int("MAX_DEPTH", "the depth beyond which a node is terminal", DEFAULT_MAX_DEPTH[task], minimum=0),
        iterations=env_int("ITERA", "the number of MCTS iterations per tree", 8, minimum=1),
        n_gen=env_int("N_GEN", "the number of model samples per expansion", 4, minimum=1),
        temperature=env_float("TEMP", "the sampling temperature", 1.0, minimum=0.0),
        max_token_length=env_int("MAX_TOKEN_LENGTH", "the prompt budget in tokens", 4096, minimum=61),
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )


def check_server(url: str) -> None:
    try:
        requests.get(url, timeout=10)
    except requests.RequestException as exc:
        raise UsageError(
            f"cannot reach the env server at {url} ({type(exc).__name__}); start it (see docs/search.md) "
            "or pass --env_server_base with its URL"
        ) from None


def task_indices(rules: tasks.TaskRules, args: argparse.Namespace, server: str) -> list[int]:
    """The training tasks this run covers (test tasks are never searched)."""
    if rules.name == "sciworld":
        nums = [args.task_num] if args.task_num is not None else list(tasks.SCIWORLD_SEARCH_ORDER[args.min:args.max])
        with rules.make_client(server) as client:
            game_nums = client.game_nums()
        chosen = tasks.sciworld_train_indices(game_nums, nums, args.task_iteration)
        where = f"task numbers {nums} x positions 1..{args.task_iteration}"
    else:
        train = rules.split_indices("train", args.split_file)
        hi = args.max if args.max is not None else float("inf")
        chosen = [i for i in train if args.min <= i < hi]
        where = f"indices in [{args.min}, {args.max if args.max is not None else 'end'}) of the {len(train)} train tasks"
    test = set(rules.split_indices("test")) if rules.test_split else set()
    dropped = [i for i in chosen if i in test]
    if dropped:
        log.warning("skipping %d test-split indices (never searched): %s", len(dropped), dropped[:10])
    chosen = [i for i in chosen if i not in test]
    if not chosen:
        raise UsageError(f"no tasks to search: {where} select none; widen --min/--max (or --task_num/--task_iteration)")
    return chosen


def existing_tree_ok(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        load_tree(path)
        return True
    except TreeFormatError as exc:
        log.warning("redoing %s: %s", path.name, exc)
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    task = env_str("TASK", "the environment to search", "textcraft").lower()
    rules = tasks.get_rules(task)
    cfg = search_config(rules.name, args)
    server = args.env_server_base or rules.default_server
    model_dir_env = os.environ.get("MODEL_DIR")
    model_name = output_model_name(args.model_name, model_dir_env)
    if rules.name != "sciworld":
        rules.split_indices("train", args.split_file)  # a bad split file fails before the server check
    check_server(server)
    indices = task_indices(rules, args, server)

    out_dir = Path(args.output_dir) / rules.name / model_name
    todo = [i for i in indices if not existing_tree_ok(out_dir / f"search_results_{i}.json")]
    skipped = len(indices) - len(todo)
    log.info("%d tasks selected, %d already searched, %d to search", len(indices), skipped, len(todo))

    started = time.time()
    backend = make_backend(args.backend, model_dir_env, seed=args.seed,
                           max_model_len=cfg.max_token_length + cfg.max_new_tokens) if todo else None
    config = {"task": rules.name, "env_server_base": server, "model_name": model_name,
              "model_dir": model_dir_env, "backend_kind": args.backend or os.environ.get("BACKEND"),
              "concurrency": args.concurrency, "split_file": args.split_file, "min": args.min, "max": args.max,
              "task_num": args.task_num, "task_iteration": args.task_iteration, "indices": len(indices),
              **{k: v for k, v in cfg.__dict__.items()}}
    totals = {"done": 0, "skipped": skipped, "failed": 0, "leaves": 0, "successful_leaves": 0, "env_steps": 0}
    items: dict[str, dict] = {}
    failed: list[int] = []
    manifest_path = out_dir / "manifest.json"

    def summary_stats() -> dict:
        extra = backend.stats.as_dict() if backend is not None else {}
        return {**totals, "wall_s": round(time.time() - started, 2), "backend": extra}

    progress = tqdm(total=len(todo), desc=f"mcts {rules.name}", unit="tree", disable=not todo)

    def on_result(res: TreeResult) -> None:
        stats = res.stats.as_dict()
        if res.error is not None:
            totals["failed"] += 1
            failed.append(res.idx)
            log.error("task %s failed: %s", res.idx, res.error)
            items[str(res.idx)] = {**stats, "error": str(res.error)}
        else:
            atomic_write_json(out_dir / f"search_results_{res.idx}.json", res.root.to_dict(), indent=2)
            totals["done"] += 1
            totals["leaves"] += res.stats.leaves
            totals["successful_leaves"] += res.stats.successful_leaves
            items[str(res.idx)] = stats
        totals["env_steps"] += res.stats.env_steps
        write_manifest(manifest_path, config, backend, summary_stats(), started, None, items)
        progress.update(1)

    try:
        if todo:
            driver = search_trees(todo, rules, lambda: rules.make_client(server), backend, cfg,
                                  concurrency=args.concurrency, on_result=on_result)
            totals["mean_batch"] = round(driver.mean_batch, 2)
    finally:
        progress.close()
        if backend is not None:
            backend.close()
    finished = time.time()
    final = summary_stats()
    if todo:
        write_manifest(manifest_path, config, backend, final, started, finished, items)
    b = final["backend"]
    print(f"trees: {totals['done']} done, {totals['skipped']} skipped, {totals['failed']} failed | "
          f"leaves {totals['leaves']} ({totals['successful_leaves']} successful) | "
          f"model calls {b.get('calls', 0)}, samples {b.get('samples', 0)}, retries {b.get('retries', 0)} | env steps {totals['env_steps']} | "
          f"{final['wall_s']:.1f}s -> {out_dir}")
    if failed:
        print(f"failed tasks (rerun to retry): {sorted(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    run_cli(main)
