"""How well the bundled model judges its own steps, on held-out TEST tasks.

    .venv/bin/python -m bench.bench_verifier [--model_dir DIR] [--episodes EVAL_DIR | --trees DIR] [--out work_dirs/bench_verifier]

1. The model's own steps on TEST-split tasks, which it never trained on:
   by default its sampled episodes (eval.py at TEMP 1.0 over the whole test
   split, run here against a local TextCraft server; ``--episodes`` reuses
   an eval output folder), each episode one path. The search cannot make
   these: mcts_collection.py never searches a test task (the contamination
   guard). ``--trees`` judges a folder of trees instead.
2. Judge every step of every leaf path with path_collection's own verifier
   path (agent_r.verifier.verify_paths with the RevisionConfig that
   PathSettings builds: the same prompts, history truncation, batching,
   seeds and parsing), at the demo's settings (MAX_TOKEN_LENGTH 2048,
   --max_new_tokens 60, greedy).
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

from agent_r import revision, verifier  # noqa: E402
from agent_r.envs import get_env  # noqa: E402
from agent_r.io import atomic_write_json, atomic_write_jsonl  # noqa: E402
from agent_r.knobs import BackendSettings  # noqa: E402
from agent_r.llm import BUNDLED_MODEL, make_backend  # noqa: E402
from agent_r.paths import result_files, tree_files  # noqa: E402
from agent_r.revision_data import PathSettings  # noqa: E402
from agent_r.conversation import parse_action  # noqa: E402
from agent_r.tree import Node, leaf_paths, load_tree  # noqa: E402
from scripts.make_verifier_data import DEMO_MAX_NEW_TOKENS, DEMO_MAX_TOKEN_LENGTH, ground_truth  # noqa: E402
from tests.support.env_fixtures import start_server, stop_server  # noqa: E402
from tests.support.tree_fixtures import backup  # noqa: E402

LABELS = (verifier.GOOD, verifier.BAD, verifier.UNCERTAIN)
EVAL_ENV = {"TASK": "textcraft", "TEMP": "1.0", "LOGLEVEL": "WARNING", "OMP_NUM_THREADS": "1"}


def sample_test_episodes(model_dir: str, out: Path) -> Path:
    """The model's sampled episodes on every test task (eval.py, TEMP 1.0)."""
    proc, url = start_server("agentenv_servers.textcraft")
    try:
        env = {**os.environ, **EVAL_ENV, "MODEL_DIR": model_dir, "MODEL_NAME": "model", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "eval.py", "--env_server_base", url, "--output_dir", str(out / "episodes"),
                        "--max_steps", "12", "--max_new_tokens", "60", "--backend", "hf", "--concurrency", "50",
                        "--hf_batch_size", "50"], cwd=ROOT, env=env, check=True)
    finally:
        stop_server(proc)
    return out / "episodes" / "textcraft" / "model_eval"


def episode_trees(folder: Path) -> list[tuple[int, Node]]:
    """Each eval episode as a one-path tree (the leaf scored by the env), so
    it goes through the same verifier path as a searched tree's leaf path."""
    test = set(get_env("textcraft").split_indices("test"))
    trees = []
    for path in sorted(result_files(folder), key=lambda p: int(p.stem.rsplit("_", 1)[1])):
        episode = json.loads(path.read_text())
        if episode["task_id"] not in test:
            raise SystemExit(f"{path}: task {episode['task_id']} is not a test task; this benchmark is on "
                             "held-out tasks only")
        state = episode["state"]
        node = root = Node(state=state[:4])
        for k in range(4, len(state) - 1, 2):
            turn, obs = state[k]["content"], state[k + 1]["content"]
            action = parse_action(turn)
            node = node.add_child(Node(obs=obs, llm_response=turn, depth=node.depth + 1, action=action,
                                       recent_actions=node.recent_actions + [[action, obs]], state=state[:k + 2]))
        if node is not root:
            node.is_terminal, node.env_score = True, float(episode["env_score"] or 0.0)
            trees.append((episode["task_id"], backup(root)))
    if not trees:
        raise SystemExit(f"no eval episodes (search_results_<idx>.json) in {folder}")
    return trees


def load_test_trees(folder: Path) -> list[tuple[int, object]]:
    test = set(get_env("textcraft").split_indices("test"))
    trees = []
    for idx, path in tree_files(folder):
        if idx not in test:
            raise SystemExit(f"{path}: task {idx} is not a test task; this benchmark is on held-out tasks only")
        trees.append((idx, load_tree(path)))
    if not trees:
        raise SystemExit(f"no search_results_<idx>.json trees in {folder}")
    return trees


def judge(trees, model_dir: str, batch: int, backend_name: str = "hf") -> tuple[list[dict], list[dict]]:
    """(one record per distinct step, one per leaf path), judged in one verify_paths call."""
    settings = PathSettings(task="textcraft", max_token_length=DEMO_MAX_TOKEN_LENGTH, max_new_tokens=DEMO_MAX_NEW_TOKENS,
                            verifier_temperature=0.0,
                            backend=BackendSettings(backend=backend_name, model_dir=model_dir, hf_batch_size=batch))
    cfg = settings.revision_config()
    jobs, owners = [], []
    for idx, root in trees:
        task = revision.head_messages(root)[3]["content"]
        for path in leaf_paths(root):
            jobs.append((task, path, cfg.seed * 1_000_003 + idx))
            owners.append(idx)
    backend = make_backend(settings.backend, seed=cfg.seed)
    try:
        verdicts, _ = verifier.verify_paths(backend, cfg, jobs)
    finally:
        backend.close()
    steps, paths = {}, []
    for (task, path, _), idx, verdict in zip(jobs, owners, verdicts):
        truth = [ground_truth(task, node.action, node.obs)[0] for node in path]
        for k, (node, reply) in enumerate(zip(path, verdict.replies)):
            key = (idx, tuple((n.action, n.obs) for n in path[:k + 1]))
            steps.setdefault(key, {"task": idx, "step": k + 1, "action": node.action, "obs": node.obs,
                                   "truth": truth[k], "model": verifier.parse_judgement(reply) or "unparseable",
                                   "reply": reply})
        first_truth = next((k + 1 for k, t in enumerate(truth) if t == verifier.BAD), None)
        paths.append({"task": idx, "score": revision.path_score(path), "length": len(path),
                      "first_bad_model": verdict.first_bad, "first_bad_truth": first_truth})
    return list(steps.values()), paths


def report(steps: list[dict], paths: list[dict], alpha: float) -> tuple[str, dict]:
    n = len(steps)
    confusion = Counter((s["truth"], s["model"]) for s in steps)
    parsed = sum(s["model"] != "unparseable" for s in steps)
    agree = sum(s["model"] == s["truth"] for s in steps)
    truth_bad = sum(s["truth"] == verifier.BAD for s in steps)
    model_bad = sum(s["model"] == verifier.BAD for s in steps)
    bad_hit = confusion[(verifier.BAD, verifier.BAD)]
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
    parser.add_argument("--episodes", default=None, help="an eval.py output folder of test episodes to judge "
                        "instead of sampling them")
    parser.add_argument("--trees", default=None, help="a folder of test-task trees to judge instead of episodes")
    parser.add_argument("--out", default="work_dirs/bench_verifier")
    parser.add_argument("--hf_batch_size", type=int, default=32)
    parser.add_argument("--backend", default="hf", help="the verifier's backend: hf (default) or vllm (run it with "
                        ".venv-vllm/bin/python)")
    args = parser.parse_args()
    out = Path(args.out)
    started = time.time()
    if args.trees:
        trees = load_test_trees(Path(args.trees))
    else:
        trees = episode_trees(Path(args.episodes) if args.episodes else sample_test_episodes(args.model_dir, out))
    searched = time.time()
    steps, paths = judge(trees, args.model_dir, args.hf_batch_size, args.backend)
    table, figures = report(steps, paths, get_env("textcraft").alpha)
    figures.update(sample_s=round(searched - started, 1), judge_s=round(time.time() - searched, 1))
    atomic_write_json(out / "bench_verifier.json", figures)
    atomic_write_jsonl(out / "steps.jsonl", steps)
    print(table)
    print(f"\nsampling {figures['sample_s']} s, judging {figures['judge_s']} s; details in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
