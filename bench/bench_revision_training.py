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

``--english plain|thought`` first teaches the model the revision sentences
outside any trajectory, the way a real LLM knows English before Agent-R:
``--english_samples`` one-turn chats ("Give me a sentence about correcting
course." -> a revision thought, as a bare sentence or as "Thought: <it>"),
mixed 1:1 with the general data, one epoch at LR 5e-4 without accumulation;
the export is then fine-tuned from that model, and the table's first row
measures it.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from agent_r.io import atomic_write_json
from agent_r.revision import REVISION_THOUGHTS
from agent_r.training.cpu import fine_tune
from agent_r.training.settings import TrainKnobs
from bench.bench_revision_turn import contexts, measure

MODELS = "models/textcraft-base"
ENGLISH_PROMPTS = (
    "Give me a sentence about correcting course.",
    "Give an example of a self-correcting remark.",
    "What might someone think after noticing they made a mistake?",
    "What do you tell yourself when an approach fails?",
    "Write one sentence a person says when they realise they went the wrong way.",
    "Say in one sentence that your plan is not working and you will change it.",
    "Describe, in one sentence, deciding to stop and rethink.",
    "How would you admit that your last steps were wrong?",
)


def english_chats(style: str, n: int, seed: int) -> list[dict]:
    """One-turn chats whose answer is a revision thought: English the model
    learns outside any trajectory (never as a turn after an observation)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        thought = rng.choice(REVISION_THOUGHTS)
        answer = f"Thought: {thought}" if style == "thought" else thought
        rows.append({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                  {"role": "user", "content": rng.choice(ENGLISH_PROMPTS)},
                                  {"role": "assistant", "content": answer, "loss": True}]})
    return rows


def english_model(args: argparse.Namespace) -> str:
    """``--model_dir``, or with ``--english`` that model taught the sentences first."""
    if args.english == "none":
        return args.model_dir
    out = Path(args.work_dir) / f"english_{args.english}"
    if not (out / "train_stats.json").exists():
        data = out / "english.json"
        atomic_write_json(data, english_chats(args.english, args.english_samples, args.seed))
        knobs = TrainKnobs(lr=5e-4, accumulative_counts=1, epochs=1, eta=1.0 if args.general_data else 0.0,
                           general_data=args.general_data, max_length=args.max_length)
        stats = fine_tune(args.model_dir, [str(data)], str(out / "hf"), knobs, seed=args.seed, threads=args.threads)
        atomic_write_json(out / "train_stats.json", stats)
    return str(out / "hf")


def train_once(args: argparse.Namespace, lr: float, acc: int) -> tuple[Path, dict]:
    root = Path(args.work_dir) if args.english == "none" else Path(args.work_dir) / f"english_{args.english}"
    out = root / f"lr{lr:g}_acc{acc}"
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
    parser.add_argument("--english", choices=("none", "plain", "thought"), default="none",
                        help="first teach the model the revision sentences as one-turn chats: the bare sentence "
                        "(plain) or 'Thought: <sentence>' (thought)")
    parser.add_argument("--english_samples", type=int, default=480)
    parser.add_argument("--out", default=None, help="write the numbers here as JSON")
    args = parser.parse_args()
    episodes = contexts(args)
    args.model_dir = english_model(args)
    start = "base" if args.english == "none" else f"base taught the sentences ({args.english})"
    rows = [{"setting": start, "steps": 0, "loss": "-", **measure(args.model_dir, episodes)}]
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
