"""Print what the demo's iterate.py run made: trees and successful leaves of the
first search, revision / good / training samples, and the test score of the
base model beside each trained one.

    python -m scripts.demo_summary demo_output/demo
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent_r import paths
from agent_r.envs import get_env
from agent_r.settings import UsageError, run_cli
from agent_r.tree import leaf_paths, load_tree


def summarize(run: Path) -> dict:
    """Numbers of an iterate.py run folder (results.json and iteration 1's trees)."""
    results = run / "results.json"
    if not results.exists():
        raise UsageError(f"{results} does not exist: run scripts/demo.sh (or iterate.py --name ...) first")
    rows = json.loads(results.read_text(encoding="utf-8"))["rows"]
    trees = paths.find_tree_files(run / "iter_1" / "trees")
    leaves = successes = solved = 0
    for path in trees:
        spec = get_env(paths.task_of(path) or "textcraft")       # .../<task>/<model>/search_results_<i>.json
        ends = [p[-1] for p in leaf_paths(load_tree(path))]
        wins = sum(1 for leaf in ends if spec.is_success(leaf.env_score))   # a full score, not a partial one
        leaves, successes, solved = leaves + len(ends), successes + wins, solved + (wins > 0)
    first = next((r for r in rows if r["iteration"] == 1), {})
    per_task = first.get("data", {}).get("tasks", {}).values()
    return {
        "trees": len(trees), "trees_with_success": solved, "leaves": leaves, "successful_leaves": successes,
        "revision_samples": sum(t.get("revision_samples", 0) for t in per_task),
        "good_samples": sum(t.get("good_samples", 0) for t in per_task),
        "xtuner_samples": first.get("data", {}).get("train_samples", 0),
        "scores": [(r["iteration"], r["variant"], t, v["tasks"], v["success_pct"], v["score_x100"])
                   for r in rows for t, v in r["test"].items()],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the iterate.py run folder (scripts/demo.sh: demo_output/demo)")
    args = p.parse_args()
    s = summarize(Path(args.run))
    print(f"trees: {s['trees']} ({s['trees_with_success']} with a successful leaf)  "
          f"leaves: {s['leaves']} ({s['successful_leaves']} successful)")
    print(f"revision samples: {s['revision_samples']}  good samples: {s['good_samples']}  "
          f"XTuner training samples: {s['xtuner_samples']}")
    for iteration, variant, task, n, success, score in s["scores"]:
        model = "base model" if iteration == 0 else f"{variant} model_{iteration}"
        print(f"test ({task}, {n} tasks): {model}: success {success:.1f}%, score x100 = {score:.2f}")
    print(f"outputs under {args.run}/ (results.md, results.json, results.png, iter_*/)")
    return 0


if __name__ == "__main__":
    run_cli(main)
