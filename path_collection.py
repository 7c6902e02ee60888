"""Revision (or good-only) training data from MCTS trees (SPEC section 4).

    TASK=textcraft MODEL_DIR=models/textcraft-tiny python path_collection.py --data_type centric --revise 1
    TASK=textcraft python path_collection.py --data_type good
    python path_collection.py export --format xtuner --output train.json \\
        --input mcts_training_data/textcraft_centric.jsonl mcts_training_data/textcraft_good.jsonl

`path_collection.py export ...` writes training files (XTuner or DPO) from
these JSONL files; see `path_collection.py export --help`.

Env vars: TASK (required), ALPHA / BETA (score thresholds on the task's scale;
defaults per task, see docs/revision.md), MODEL_DIR / MODEL_NAME (the verifier
model and the name in the default input path), TEMP (verifier temperature when
--verifier_temperature is not given; default 0 = greedy), MAX_TOKEN_LENGTH
(verifier prompt limit, default 4096). A model is loaded only for
--data_type centric --revise 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from agent_r import revision
from agent_r.config import UsageError, env_float, env_int, env_str, run_cli, setup_logging
from agent_r.io import atomic_write_json, atomic_write_jsonl, read_json
from agent_r.manifest import write_manifest
from agent_r.tasks import get_rules
from agent_r.tree import TreeFormatError, load_tree

log = logging.getLogger("path_collection")

# (ALPHA, BETA) per task: a good path must score above ALPHA, a pair must differ
# by more than BETA. TextCraft scores are 0/1; WebShop 0-1; SciWorld 0-100.
DEFAULT_THRESHOLDS = {"textcraft": (0.5, 0.5), "webshop": (0.5, 0.3), "sciworld": (50.0, 30.0)}
TREE_FILE = re.compile(r"^search_results_(\d+)\.json$")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_dir", default=None, help="trees (default mcts_result/{TASK}/{model_name})")
    p.add_argument("--output_dir", default="mcts_training_data", help="where {TASK}_{data_type}.jsonl goes")
    p.add_argument("--data_type", choices=("centric", "good"), default="centric",
                   help="centric: revision pairs; good: good paths only (default centric)")
    p.add_argument("--revise", type=int, choices=(0, 1), default=1,
                   help="1: the model finds the first bad step; 0: whole low path is the bad prefix (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed for pair shuffling and revision thoughts (default 0)")
    p.add_argument("--max_pairs_per_tree", type=int, default=8, help="pairs kept per tree, 0 = all (default 8)")
    p.add_argument("--verifier_temperature", type=float, default=None,
                   help="verifier sampling temperature (default: TEMP if set, else 0 = greedy)")
    p.add_argument("--backend", default=None, help="vllm | openai | hf | python:MODULE:FACTORY (default: BACKEND, else auto)")
    p.add_argument("--max_new_tokens", type=int, default=500, help="verifier reply length limit (default 500)")
    p.add_argument("--tree_batch", type=int, default=32,
                   help="trees whose verifier prompts go into one batched model call (default 32)")
    args = p.parse_args(argv)
    for flag in ("max_new_tokens", "tree_batch"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be >= 1 (got {getattr(args, flag)})")
    if args.max_pairs_per_tree < 0:
        raise UsageError(f"--max_pairs_per_tree must be >= 0 (0 = no cap), got {args.max_pairs_per_tree}")
    if args.verifier_temperature is not None and args.verifier_temperature < 0:
        raise UsageError(f"--verifier_temperature must be >= 0, got {args.verifier_temperature}")
    return args


def find_trees(input_dir: Path) -> list[tuple[int, Path]]:
    """search_results_{idx}.json files in index order (manifest.json etc. ignored)."""
    if not input_dir.is_dir():
        raise UsageError(f"input dir {input_dir} does not exist: run mcts_collection.py first, "
                         "or pass --input_dir (or set MODEL_NAME) to point at its trees")
    trees = sorted((int(m.group(1)), input_dir / name) for name in os.listdir(input_dir)
                   if (m := TREE_FILE.match(name)))
    if not trees:
        raise UsageError(f"input dir {input_dir} has no search_results_<idx>.json trees: run "
                         "mcts_collection.py first, or pass --input_dir pointing at its output")
    return trees


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_part(path: Path, fingerprint: dict) -> dict | None:
    """A cached per-tree result, if it was made from the same tree and settings."""
    if not path.exists():
        return None
    try:
        part = read_json(path)
    except ValueError:
        return None
    if not isinstance(part, dict) or part.get("fingerprint") != fingerprint or "result" not in part:
        return None
    return part["result"]


class Collector:
    """Runs the trees through plan -> (batched verifier) -> rows, one part file per tree."""

    def __init__(self, args: argparse.Namespace, task: str, cfg: revision.RevisionConfig,
                 model_dir: str | None) -> None:
        self.args, self.task, self.cfg, self.model_dir = args, task, cfg, model_dir
        self.parts_dir = Path(args.output_dir) / ".parts" / f"{task}_{cfg.data_type}"
        self.backend = None
        self.base_fingerprint = {"config": dataclasses.asdict(cfg),
                                 "verifier": [args.backend or os.environ.get("BACKEND"), model_dir]
                                 if cfg.needs_verifier else None}

    def get_backend(self):
        if self.backend is None:
            from agent_r import llm

            self.backend = llm.make_backend(self.args.backend, self.model_dir, seed=self.cfg.seed)
        return self.backend

    def run_batch(self, batch: list[tuple[int, Path, dict]], results: dict[int, dict], failed: list[str]) -> None:
        plans, fps = [], []
        for idx, path, fp in batch:
            try:
                plan = revision.plan_tree(idx, load_tree(path), self.cfg)
            except TreeFormatError as exc:
                log.error("skipping %s: %s", path.name, exc)
                failed.append(path.name)
                continue
            if plan is None:
                self.save(idx, fp, revision.TreeResult(skipped=True), results)
                continue
            plans.append(plan)
            fps.append(fp)
        if not plans:
            return
        needs_model = self.cfg.needs_verifier and any(p.low_paths for p in plans)
        for plan, fp, res in zip(plans, fps, revision.process_trees(plans, self.cfg,
                                                                     self.get_backend() if needs_model else None)):
            self.save(plan.idx, fp, res, results)

    def save(self, idx: int, fp: dict, res: revision.TreeResult, results: dict[int, dict]) -> None:
        result = res.to_dict()
        atomic_write_json(self.parts_dir / f"{idx}.json", {"fingerprint": fp, "result": result}, indent=None)
        results[idx] = result

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def collect(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = get_rules(env_str("TASK", "the environment the trees come from: textcraft, sciworld or webshop")).name
    alpha0, beta0 = DEFAULT_THRESHOLDS[task]
    alpha = env_float("ALPHA", "the score a good path's leaf must exceed (task score scale)", alpha0)
    beta = env_float("BETA", "the score gap a (good, bad) pair must exceed (task score scale)", beta0, minimum=0.0)
    temperature = args.verifier_temperature
    if temperature is None:
        temperature = env_float("TEMP", "the verifier's sampling temperature (0 = greedy)", 0.0, minimum=0.0)
    cfg = revision.RevisionConfig(
        alpha=alpha, beta=beta, data_type=args.data_type, revise=bool(args.revise), seed=args.seed,
        max_pairs_per_tree=args.max_pairs_per_tree, verifier_temperature=temperature,
        max_new_tokens=args.max_new_tokens,
        max_token_length=env_int("MAX_TOKEN_LENGTH", "the verifier prompt token limit", 4096, minimum=100),
    )
    model_dir = os.environ.get("MODEL_DIR") or None  # raw, as make_backend takes it
    if args.input_dir:
        input_dir = Path(args.input_dir)
    else:
        from agent_r.llm import output_model_name

        input_dir = Path("mcts_result") / task / output_model_name(None, model_dir)
    trees = find_trees(input_dir)
    collector = Collector(args, task, cfg, model_dir if cfg.needs_verifier else None)

    results: dict[int, dict] = {}
    failed: list[str] = []
    todo = []
    for idx, path in trees:
        fp = collector.base_fingerprint | {"tree_sha256": file_sha256(path)}
        cached = load_part(collector.parts_dir / f"{idx}.json", fp)
        if cached is None:
            todo.append((idx, path, fp))
        else:
            results[idx] = cached
    log.info("%d trees in %s, %d already processed", len(trees), input_dir, len(trees) - len(todo))
    verifier_this_run = 0
    started = time.time()
    try:
        with tqdm(total=len(todo), desc="trees", unit="tree") as bar:
            for start in range(0, len(todo), args.tree_batch):
                batch = todo[start:start + args.tree_batch]
                before = {idx for idx in results}
                collector.run_batch(batch, results, failed)
                verifier_this_run += sum(results[i]["verifier_prompts"] for i in results if i not in before)
                bar.update(len(batch))
    finally:
        collector.close()

    rows = [row for idx, _ in trees if idx in results for row in results[idx]["rows"]]
    out = Path(args.output_dir) / f"{task}_{cfg.data_type}.jsonl"
    atomic_write_jsonl(out, rows)
    backend_stats = collector.backend.stats.as_dict() if collector.backend is not None else {}
    write_manifest(out.with_name(f"{out.stem}.manifest.json"),
                   {**dataclasses.asdict(cfg), "input_dir": str(input_dir), "backend_kind": args.backend
                    or os.environ.get("BACKEND"), "model_dir": model_dir if cfg.needs_verifier else None},
                   collector.backend, {"trees": len(trees), "failed": failed, "rows": len(rows),
                                       "verifier_prompts_this_run": verifier_this_run, "backend": backend_stats},
                   started, time.time())
    print(summary(trees, results, failed, cfg, verifier_this_run, out, len(rows)))
    if backend_stats:
        print(f"model calls {backend_stats['calls']}, retries {backend_stats['retries']}")
    if failed:
        print(f"error: {len(failed)} tree(s) could not be read: {', '.join(failed)} "
              "(fix or delete them, or rerun mcts_collection.py for those tasks)", file=sys.stderr)
        return 1
    return 0


def summary(trees, results: dict[int, dict], failed: list[str], cfg: revision.RevisionConfig,
            verifier_this_run: int, out: Path, n_rows: int) -> str:
    done = [results[idx] for idx, _ in trees if idx in results]
    total = lambda key: sum(r[key] for r in done)  # noqa: E731
    hist = Counter()
    for r in done:
        hist.update(r["first_bad"])
    lines = [
        f"trees read: {len(trees)}  skipped (no success): {sum(r['skipped'] for r in done)}  failed: {len(failed)}",
        f"pairs: {total('pairs')}  revision samples: {total('revision_samples')}  "
        f"good samples: {total('good_samples')}  pairs without good suffix (dropped): {total('empty_suffix_pairs')}",
        f"verifier calls (prompts): {total('verifier_prompts')} ({verifier_this_run} this run)  "
        f"unparseable judgements: {total('unparseable')}",
        f"first bad step (position:paths): {revision.histogram(hist)}",
        f"wrote {n_rows} rows to {out}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        from agent_r import export

        return export.main(argv[1:])
    return collect(argv)


if __name__ == "__main__":
    run_cli(main)
