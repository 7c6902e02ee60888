"""Evaluate a policy on the held-out test tasks (SPEC section 5).

    TASK=textcraft MODEL_DIR=models/tiny python eval.py --limit 20
    python eval.py --compare test_result/textcraft/iter0_eval test_result/textcraft/iter1_eval

Env vars: TASK (required), MODEL_DIR (default: the bundled model), MODEL_NAME,
MODEL_TYPE (folder label, default "eval"), TEMP (default 1.0, the reference's
sampling; TEMP=0 is greedy), MAX_TOKEN_LENGTH (default 4096). See docs/evaluation.md.
"""
from __future__ import annotations

import argparse
import logging
import os

from agent_r import evaluation
from agent_r.config import UsageError, env_float, env_int, env_str, run_cli, setup_logging

log = logging.getLogger("eval")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env_server_base", default=None, help="env server URL (default: the task's local server)")
    p.add_argument("--model_name", default=None, help="name in outputs (default: MODEL_NAME, else MODEL_DIR's basename)")
    p.add_argument("--max_steps", type=int, default=100, help="model turns per episode (default 100)")
    p.add_argument("--split_file", default=None, help="AgentGym task list (default: the project's test split)")
    p.add_argument("--output_dir", default="test_result", help="results root (default test_result)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes run side by side; their turns are batched (default 8)")
    p.add_argument("--seed", type=int, default=0, help="run seed; per-request seeds derive from (seed, task, step)")
    p.add_argument("--backend", default=None, help="vllm | openai | hf | python:MODULE:FACTORY (default: BACKEND, else auto)")
    p.add_argument("--max_new_tokens", type=int, default=500, help="tokens per model turn (default 500)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks (or revise rows)")
    p.add_argument("--compare", nargs="+", metavar="DIR", default=None, help="print these runs' summaries side by side and exit")
    p.add_argument("--revise_from", default=None, help="JSONL of failed trajectories to continue (revision task)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    if args.compare:
        print(evaluation.compare(args.compare, os.environ.get("TASK")))
        return 0
    for flag in ("concurrency", "max_new_tokens", "max_steps"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be >= 1 (got {getattr(args, flag)})")

    from agent_r import llm

    task = env_str("TASK", "the environment to evaluate: textcraft, sciworld or webshop")
    model_dir = os.environ.get("MODEL_DIR", "").strip() or None   # None: the bundled model
    model_name = llm.output_model_name(args.model_name, model_dir)
    cfg = evaluation.EvalConfig(
        task=task,
        model_name=model_name,
        model_type=env_str("MODEL_TYPE", "a label for the output folder", "eval"),
        output_dir=args.output_dir,
        env_server_base=args.env_server_base,
        max_steps=args.max_steps,
        max_token_length=env_int("MAX_TOKEN_LENGTH", "the prompt token limit", 4096, minimum=100),
        max_new_tokens=args.max_new_tokens,
        temperature=env_float("TEMP", "the sampling temperature (0 = greedy)", 1.0, minimum=0.0),
        concurrency=args.concurrency,
        seed=args.seed,
        limit=args.limit,
        split_file=args.split_file,
        revise_from=args.revise_from,
    )
    rules, jobs, todo = evaluation.plan(cfg)
    log.info("%d tasks, %d already done in %s", len(jobs), len(jobs) - len(todo), cfg.run_dir())
    backend, clients = None, []
    try:
        if todo:
            clients.append(rules.make_client(cfg.env_server_base))  # fail fast before loading the model
            backend = llm.make_backend(args.backend, model_dir, seed=cfg.seed)
        summary = evaluation.run_eval(cfg, backend, rules, todo, clients=clients)
        clients = []   # run_eval closed them (closing twice is harmless)
    finally:
        for client in clients:
            client.close()
        if backend is not None:
            backend.close()
    print(evaluation.format_table([summary], [f"{cfg.model_name}_{cfg.model_type}"]))
    if backend is not None:
        b = backend.stats
        print(f"model calls {b.calls}, requests {b.requests}, retries {b.retries}")
    print(f"results: {cfg.run_dir()}")
    return 0


if __name__ == "__main__":
    run_cli(main)
