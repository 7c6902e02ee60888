"""How much fine-tuning it takes before a model writes the revision turn.

    .venv/bin/python -m bench.bench_revision_training --data RUN/iter_1/data/agent-r/train.json \\
        --general_data RUN/general_data/policy.jsonl,RUN/general_data/verifier.jsonl \\
        --episodes RUN/iter_0/eval/base/textcraft/<label>_test --lr 1e-4 5e-4 --accumulative_counts 16 4

The loop's fine-tune of a tiny from-scratch model may move too little to
teach the revision turn: its sentences are new to the model, where a real
LLM already writes English. This fine-tunes the base model (``--model_dir``)
on one export once per (LR, accumulation) setting with the loop's CPU
trainer and the loop's other knobs (3% warm-up, cosine, ``--epochs``,
general data at ``--eta``), then measures each result as
bench_revision_turn does: the revision turn's log-probability and greedy
answers in the failed episodes of ``--episodes``, cut after ``--cut`` model
turns, and which part of the turn costs the log-probability: the first word
(the choice to revise), the rest of the sentence (writing English) or the
action. Prints a table; ``--out`` writes the numbers as JSON. The models go
to ``--work_dir`` (reused when there: rerunning only measures).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent_r.io import atomic_write_json
from agent_r.training.cpu import fine_tune
from agent_r.training.settings import TrainKnobs
from bench.bench_revision_turn import contexts, measure

MODELS = "models/textcraft-base"


def train_once(args: argparse.Namespace, lr: float, acc: int) -> tuple[Path, dict]:
    out = Path(args.work_dir) / f"lr{lr:g}_acc{acc}"
    stats_file = out / "train_stats.json"
    if stats_file.exists():
        return out / "hf", json.loads(stats_file.read_text())
    knobs = TrainKnobs(lr=lr, accumulative_counts=acc, epochs=args.epochs, eta=args.eta,
                       general_data=args.general_data, max_length=args.max_length)
    stats = fine_tune(args.model_dir, [args.data], str(out / "hf"), knobs, seed=args.seed, threads=args.threads)
    atomic_write_json(stats_file, stats)
    return out / "hf", stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="an export (path_collection.py export --format xtuner)")
    parser.add_argument("--episodes", required=True, help="an eval.py output folder; its failed episodes are the contexts")
    parser.add_argument("--model_dir", default=MODELS, help=f"the model fine-tuned (default {MODELS})")
    parser.add_argument("--general_data", default="", help="general data files, comma-separated (GENERAL_DATA)")
    parser.add_argument("--eta", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max_length", type=int, default=2048)
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-4])
    parser.add_argument("--accumulative_counts", type=int, nargs="+", default=[16])
    parser.add_argument("--limit", type=int, default=20, help="failed episodes used as contexts")
    parser.add_argument("--cut", type=int, default=3, help="model turns kept per context (0 = all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work_dir", default="work_dirs/bench_revision_training")
    parser.add_argument("--out", default=None, help="write the numbers here as JSON")
    args = parser.parse_args()
    episodes = contexts(args)
    rows = [{"setting": "base", "steps": 0, "loss": "-", **measure(args.model_dir, episodes)}]
    for lr in args.lr:
        for acc in args.accumulative_counts:
            model, stats = train_once(args, lr, acc)
            rows.append({"setting": f"LR {lr:g}, accumulation {acc}", "steps": stats["steps"],
                         "loss": f"{stats['first_loss']} -> {stats['last_loss']}", **measure(str(model), episodes)})
    print(f"contexts: {len(episodes)} failed episodes of {args.episodes}, cut after {args.cut} model turns\n")
    print("| setting | optimizer steps | train loss | revision turn log-prob (mean) | of it: first word / rest of "
          "the sentence / action | any revision turn log-prob (mean / max) | greedy revision turns |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        parts = " / ".join(str(r["revision_turn_logprob_parts"][k]) for k in ("first_word", "sentence_rest", "action"))
        print(f"| {r['setting']} | {r['steps']} | {r['loss']} | {r['revision_turn_logprob_mean']} | {parts} | "
              f"{r['revision_mass_logprob_mean']} / {r['revision_mass_logprob_max']} | "
              f"{r['greedy_revision_turns']} / {r['contexts']} |")
    if args.out:
        atomic_write_json(args.out, {"args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
