"""How well the bundled model judges its own steps, on held-out TEST tasks.

    .venv/bin/python bench/bench_verifier.py [--tasks 30] [--trees DIR] [--out work_dirs/bench_verifier]

1. Search trees on ``--tasks`` TEST-split tasks (evenly spread) with the model
   (mcts_collection.py against a local TextCraft server; ``--trees`` reuses a
   folder of trees instead). The model never trained on these tasks.
2. Judge every step of every leaf path with path_collection's own verifier
   path (agent_r.revision.verify_paths with the RevisionConfig that
   PathSettings builds: the same prompts, history truncation, batching,
   seeds and parsing), at the demo's settings (MAX_TOKEN_LENGTH 2048,
   --max_new_tokens 100, greedy).
3. Compare with the ground truth of scripts/make_verifier_data.ground_truth
   (the game's answer and the task's recipes): parse rate, agreement,
   confusion matrix, Bad recall/precision, and how often the first step
   judged Bad is the first ground-truth Bad step (the cut path_collection
   makes), on failed paths (the ones path_collection judges) and on all.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_r import revision  # noqa: E402
from agent_r.envs import get_env  # noqa: E402
from agent_r.io import atomic_write_json, atomic_write_jsonl  # noqa: E402
from agent_r.llm import BUNDLED_MODEL, make_backend  # noqa: E402
from agent_r.revision_data import PathSettings  # noqa: E402
from agent_r.settings import BackendSettings  # noqa: E402
from agent_r.tree import leaf_paths, load_tree  # noqa: E402
from scripts.make_verifier_data import DEMO_MAX_TOKEN_LENGTH, ground_truth  # noqa: E402
from tests.support.env_fixtures import start_server, stop_server  # noqa: E402

LABELS = (revision.GOOD, revision.BAD, revision.UNCERTAIN)
SEARCH_ENV = {"TASK": "textcraft", "ITERA": "2", "N_GEN": "4", "MAX_DEPTH": "10", "TEMP": "1.0",
              "MAX_TOKEN_LENGTH": str(DEMO_MAX_TOKEN_LENGTH), "LOGLEVEL": "WARNING"}


def search_test_trees(model_dir: str, tasks: int, out: Path) -> Path:
    """Trees of ``tasks`` test tasks spread evenly over the split (easy to
    hard: the split is ordered by recipe depth), searched by the model."""
    split_all = get_env("textcraft").split_indices("test")
    test = [split_all[i * len(split_all) // tasks] for i in range(min(tasks, len(split_all)))]
    split = out / "test_split.json"
    split.parent.mkdir(parents=True, exist_ok=True)
    split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in test]))
    proc, url = start_server("agentenv_servers.textcraft")
    try:
        env = {**os.environ, **SEARCH_ENV, "MODEL_DIR": model_dir, "MODEL_NAME": "model", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "mcts_collection.py", "--env_server_base", url, "--split_file", str(split),
                        "--output_dir", str(out / "mcts_test"), "--max_new_tokens", "60", "--backend", "hf",
                        "--concurrency", "32", "--hf_batch_size", "32"], cwd=ROOT, env=env, check=True)
    finally:
        stop_server(proc)
    return out / "mcts_test" / "textcraft" / "model"


def load_test_trees(folder: Path) -> list[tuple[int, object]]:
    test = set(get_env("textcraft").split_indices("test"))
    trees = []
    for path in sorted(folder.glob("search_results_*.json"), key=lambda p: int(p.stem.rsplit("_", 1)[1])):
        idx = int(path.stem.rsplit("_", 1)[1])
        if idx not in test:
            raise SystemExit(f"{path}: task {idx} is not a test task; this benchmark is on held-out tasks only")
        trees.append((idx, load_tree(path)))
    if not trees:
        raise SystemExit(f"no search_results_<idx>.json trees in {folder}")
    return trees


def judge(trees, model_dir: str, batch: int) -> tuple[list[dict], list[dict]]:
    """(one record per distinct step, one per leaf path), judged in one verify_paths call."""
    settings = PathSettings(task="textcraft", max_token_length=DEMO_MAX_TOKEN_LENGTH, max_new_tokens=100,
                            verifier_temperature=0.0,
                            backend=BackendSettings(backend="hf", model_dir=model_dir, hf_batch_size=batch))
    cfg = settings.revision_config()
    jobs, owners = [], []
    for idx, root in trees:
        task = revision.head_messages(root)[3]["content"]
        for path in leaf_paths(root):
            jobs.append((task, path, cfg.seed * 1_000_003 + idx))
            owners.append(idx)
    backend = make_backend(settings.backend, seed=cfg.seed)
    try:
        verdicts, _ = revision.verify_paths(backend, cfg, jobs)
    finally:
        backend.close()
    steps, paths = {}, []
    for (task, path, _), idx, verdict in zip(jobs, owners, verdicts):
        truth = [ground_truth(task, node.action, node.obs)[0] for node in path]
        for k, (node, reply) in enumerate(zip(path, verdict.replies)):
            key = (idx, tuple((n.action, n.obs) for n in path[:k + 1]))
            steps.setdefault(key, {"task": idx, "step": k + 1, "action": node.action, "obs": node.obs,
                                   "truth": truth[k], "model": revision.parse_judgement(reply) or "unparseable",
                                   "reply": reply})
        first_truth = next((k + 1 for k, t in enumerate(truth) if t == revision.BAD), None)
        paths.append({"task": idx, "score": revision.path_score(path), "length": len(path),
                      "first_bad_model": verdict.first_bad, "first_bad_truth": first_truth})
    return list(steps.values()), paths


def report(steps: list[dict], paths: list[dict], alpha: float) -> tuple[str, dict]:
    n = len(steps)
    confusion = Counter((s["truth"], s["model"]) for s in steps)
    parsed = sum(s["model"] != "unparseable" for s in steps)
    agree = sum(s["model"] == s["truth"] for s in steps)
    truth_bad = sum(s["truth"] == revision.BAD for s in steps)
    model_bad = sum(s["model"] == revision.BAD for s in steps)
    bad_hit = confusion[(revision.BAD, revision.BAD)]
    failed = [p for p in paths if p["score"] <= alpha]
    match = lambda ps: sum(p["first_bad_model"] == p["first_bad_truth"] for p in ps)  # noqa: E731
    figures = {"steps": n, "parse_rate": parsed / n, "agreement": agree / n,
               "bad_recall": bad_hit / max(1, truth_bad), "bad_precision": bad_hit / max(1, model_bad),
               "truth_counts": dict(Counter(s["truth"] for s in steps)),
               "paths": len(paths), "failed_paths": len(failed),
               "first_bad_match_failed": match(failed) / max(1, len(failed)),
               "first_bad_match_all": match(paths) / max(1, len(paths)),
               "confusion": {f"{t}->{m}": c for (t, m), c in sorted(confusion.items())}}
    lines = [f"steps judged (distinct): {n}   leaf paths: {len(paths)} ({len(failed)} failed)", "",
             "| metric | value |", "|---|---:|",
             f"| parseable replies | {figures['parse_rate']:.1%} ({parsed}/{n}) |",
             f"| agreement with ground truth | {figures['agreement']:.1%} ({agree}/{n}) |",
             f"| Bad recall | {figures['bad_recall']:.1%} ({bad_hit}/{truth_bad}) |",
             f"| Bad precision | {figures['bad_precision']:.1%} ({bad_hit}/{model_bad}) |",
             f"| first Bad = ground-truth first bad step, failed paths | {figures['first_bad_match_failed']:.1%} "
             f"({match(failed)}/{len(failed)}) |",
             f"| first Bad = ground-truth first bad step, all paths | {figures['first_bad_match_all']:.1%} "
             f"({match(paths)}/{len(paths)}) |", "",
             "| truth \\ model | " + " | ".join(LABELS) + " | unparseable |", "|---|---:|---:|---:|---:|"]
    for t in LABELS:
        lines.append(f"| {t} | " + " | ".join(str(confusion[(t, m)]) for m in LABELS + ("unparseable",)) + " |")
    return "\n".join(lines), figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", default=str(BUNDLED_MODEL))
    parser.add_argument("--tasks", type=int, default=30, help="test tasks searched, evenly spread (default 30)")
    parser.add_argument("--trees", default=None, help="a folder of test-task trees to judge instead of searching")
    parser.add_argument("--out", default="work_dirs/bench_verifier")
    parser.add_argument("--hf_batch_size", type=int, default=32)
    args = parser.parse_args()
    out = Path(args.out)
    started = time.time()
    folder = Path(args.trees) if args.trees else search_test_trees(args.model_dir, args.tasks, out)
    searched = time.time()
    steps, paths = judge(load_test_trees(folder), args.model_dir, args.hf_batch_size)
    table, figures = report(steps, paths, get_env("textcraft").alpha)
    figures.update(search_s=round(searched - started, 1), judge_s=round(time.time() - searched, 1))
    atomic_write_json(out / "bench_verifier.json", figures)
    atomic_write_jsonl(out / "steps.jsonl", steps)
    print(table)
    print(f"\nsearch {figures['search_s']} s, judging {figures['judge_s']} s; details in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
