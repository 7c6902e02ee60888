"""Print what the demo produced: trees, successful leaves, revision samples, test score.

    python -m scripts.demo_summary demo_output --task textcraft --model_name textcraft-tiny
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent_r.config import UsageError, run_cli
from agent_r.tree import leaf_paths, load_tree


def count_jsonl(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip()) if path.exists() else 0


def summarize(out: Path, task: str, model_name: str) -> dict:
    tree_dir = out / "mcts_result" / task / model_name
    trees = sorted(tree_dir.glob("search_results_*.json"))
    if not trees:
        raise UsageError(f"no trees in {tree_dir}: run scripts/demo.sh (or mcts_collection.py) first")
    leaves = successes = solved = 0
    for path in trees:
        paths = leaf_paths(load_tree(path))
        wins = sum(1 for p in paths if p[-1].value > 0)
        leaves, successes, solved = leaves + len(paths), successes + wins, solved + (wins > 0)
    data = out / "mcts_training_data"
    xtuner = out / "xtuner_train.json"
    evals = sorted((out / "test_result" / task).glob("*/search_results_*.json"))
    scores = [json.loads(p.read_text(encoding="utf-8"))["env_score"] for p in evals]
    return {
        "trees": len(trees), "trees_with_success": solved, "leaves": leaves, "successful_leaves": successes,
        "revision_samples": count_jsonl(data / f"{task}_centric.jsonl"),
        "good_samples": count_jsonl(data / f"{task}_good.jsonl"),
        "xtuner_samples": len(json.loads(xtuner.read_text(encoding="utf-8"))) if xtuner.exists() else 0,
        "test_tasks": len(scores), "test_success": sum(1 for s in scores if s >= 1),
        "test_score_x100": round(100 * sum(scores) / len(scores), 2) if scores else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the demo folder (default layout of scripts/demo.sh)")
    p.add_argument("--task", default="textcraft")
    p.add_argument("--model_name", default="textcraft-tiny")
    args = p.parse_args()
    s = summarize(Path(args.out), args.task, args.model_name)
    print(f"trees: {s['trees']} ({s['trees_with_success']} with a successful leaf)  "
          f"leaves: {s['leaves']} ({s['successful_leaves']} successful)")
    print(f"revision samples: {s['revision_samples']}  good samples: {s['good_samples']}  "
          f"XTuner training samples: {s['xtuner_samples']}")
    print(f"test: {s['test_success']}/{s['test_tasks']} solved, score x100 = {s['test_score_x100']}")
    print(f"outputs under {args.out}/")
    return 0


if __name__ == "__main__":
    run_cli(main)
