"""TRL's SFTTrainer (agent_r/training/trl_sft.py) vs the CPU trainer
(agent_r/training/cpu.py) on the same export and model: time per epoch, tokens
per second, and the loss the trained model has afterwards on the training
samples (one function for both, per trained token, XTuner's labels).

    nice -n 10 .venv/bin/python -m bench.bench_trainers [--trees 16] [--pairs_per_tree 4] [--epochs 2] [--threads 2]

The export is built by the real export code from synthetic search trees
(bench/bench_revision.py's: branching 3, depth 4, 30% successful leaves),
``--pairs_per_tree`` revision rows per tree judged by its scripted verifier, plus
as many good rows. The model is the
bundled textcraft-tiny (3M parameters), fp32 on CPU. Each trainer runs in its
own process with ``--threads`` torch threads; load and save times are left
out of the per-epoch time (both are a second or two).

The trainers batch differently, so the table says how: the CPU trainer
fills a batch with samples of one task up to MAX_LENGTH tokens and runs
their shared prefix once; TRL takes ``--trl_batch`` samples per step (by
default as many as the CPU trainer's mean, so both take about the same
number of steps), padded, without a shared prefix. The ``plain`` row is a
bare PyTorch loop on TRL-shaped batches: the part of the gap that is TRL's
own overhead rather than the batching. ``--repeats`` interleaves the rows
and keeps each one's fastest run (the dev box is shared and noisy).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "textcraft-tiny"


def build_export(trees: int, pairs_per_tree: int, path: Path) -> int:
    from agent_r import export, revision
    from agent_r.revision_data import PathSettings
    from bench.bench_revision import policy, synthetic_tree
    from tests.support.doubles import ScriptedBackend

    centric = PathSettings(task="textcraft", alpha=0.5, beta=0.5, max_pairs_per_tree=pairs_per_tree).revision_config()
    good = PathSettings(task="textcraft", alpha=0.5, beta=0.5, data_type="good").revision_config()
    plans = [revision.plan_tree(i, synthetic_tree(i), centric) for i in range(trees)]
    plans = [pl for pl in plans if pl is not None]
    revisions = [r for t in revision.process_trees(plans, centric, ScriptedBackend(policy)) for r in t.rows]
    good_plans = [revision.plan_tree(pl.idx, pl.root, good) for pl in plans]
    goods = [r for t in revision.process_trees(good_plans, good, None) for r in t.rows]
    samples = export.xtuner_samples(revisions, goods, 1.0, 0)
    path.write_text(json.dumps(samples))
    return len(samples)


def eval_loss(model, data) -> float:
    """Mean cross-entropy per trained token over ``data`` (the CPU trainer's Examples)."""
    import torch

    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ex in data:
            out = model(input_ids=torch.tensor([ex.ids]), labels=torch.tensor([ex.labels]))
            k = sum(1 for y in ex.labels[1:] if y != -100)
            total, tokens = total + out.loss.item() * k, tokens + k
    return total / tokens


def plain_loop(model, data, cfg, batch: int, pad: int) -> float:
    """A bare PyTorch loop on batches shaped like TRL's (``batch`` random
    samples, right-padded, one step each, constant LR): what TRL adds on top."""
    import random

    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0)
    model.train()
    rng, loss = random.Random(0), None
    for _ in range(cfg.epochs):
        order = list(range(len(data)))
        rng.shuffle(order)
        for i in range(0, len(order), batch):
            rows = [data[j] for j in order[i:i + batch]]
            width = max(len(e.ids) for e in rows)
            ids = torch.full((len(rows), width), pad)
            labels = torch.full((len(rows), width), -100)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for k, e in enumerate(rows):
                ids[k, :len(e.ids)], labels[k, :len(e.ids)], mask[k, :len(e.ids)] = \
                    torch.tensor(e.ids), torch.tensor(e.labels), 1
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return loss.item()


def cpu_knobs(args: argparse.Namespace, epochs: int):
    """The CPU trainer's knobs for this bench: no warm-up, no general data, one step per batch."""
    from agent_r.training.settings import TrainKnobs

    return TrainKnobs(lr=args.lr, epochs=epochs, max_length=args.max_length, batch_size=1, accumulative_counts=1,
                      warmup_ratio=0.0, general_data="", eta=0.0)


def run_one(kind: str, data_file: str, args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r.training import cpu, trl_sft

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(MODEL)
    data = cpu.examples(json.loads(Path(data_file).read_text()), tok, args.max_length)
    tokens = sum(len(e.ids) for e in data)
    knobs = cpu_knobs(args, args.epochs)
    if kind == "cpu":
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
        steps = cpu.plan_steps(data, knobs, 0)
        t0 = time.perf_counter()
        losses = cpu.fit(model, steps, knobs, tok.pad_token_id)
        seconds = time.perf_counter() - t0
        n_steps, last = len(steps), losses[-1]
    elif kind == "plain":
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
        t0 = time.perf_counter()
        last = plain_loop(model, data, knobs, args.trl_batch, tok.pad_token_id)
        n_steps = -(-len(data) // args.trl_batch)
        seconds, n_steps = time.perf_counter() - t0, n_steps * args.epochs
    else:
        batch, accum = (args.trl_batch, 1) if kind == "trl" else (1, args.trl_batch)
        cfg = trl_sft.TrlConfig(lr=args.lr, epochs=args.epochs, max_length=args.max_length, batch_size=batch,
                                accumulative_counts=accum, warmup_ratio=0.0, precision="fp32",
                                gradient_checkpointing="0", save_steps=10**6, threads=args.threads)
        with tempfile.TemporaryDirectory() as out:
            run = trl_sft.prepare(str(MODEL), [data_file], out, cfg)
            t0 = time.perf_counter()
            run.trainer.train()
            seconds = time.perf_counter() - t0
            model, n_steps = run.trainer.model, run.trainer.state.global_step
            last = [r["loss"] for r in run.trainer.state.log_history if "loss" in r][-1]
    return {"kind": kind, "samples": len(data), "steps": n_steps, "epoch_s": seconds / args.epochs,
            "tokens_per_s": tokens * args.epochs / seconds, "last_step_loss": last,
            "loss_after": eval_loss(model, data), "loss_before": args.loss_before}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", type=int, default=16)
    p.add_argument("--pairs_per_tree", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max_length", type=int, default=4096)
    p.add_argument("--trl_batch", type=int, default=0,
                   help="TRL samples per step; 0 = the CPU trainer's mean samples per step (about the same steps)")
    p.add_argument("--runs", default="cpu,trl,plain", help="rows, of cpu, trl, trl-accum, plain")
    p.add_argument("--repeats", type=int, default=1, help="runs of each row, interleaved; the fastest is shown")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--run", choices=("cpu", "trl", "trl-accum", "plain"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--loss_before", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        print(json.dumps(run_one(args.run, args.data, args)))
        return

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r.training import cpu

    work = Path(tempfile.mkdtemp(prefix="bench_trainers_"))
    data_file = work / "train.json"
    n = build_export(args.trees, args.pairs_per_tree, data_file)
    tok = AutoTokenizer.from_pretrained(MODEL)
    data = cpu.examples(json.loads(data_file.read_text()), tok, args.max_length)
    torch.set_num_threads(args.threads)
    before = eval_loss(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32), data)
    tokens = sum(len(e.ids) for e in data)
    if not args.trl_batch:
        args.trl_batch = max(1, round(len(data) / len(cpu.plan_steps(data, cpu_knobs(args, 1), 0))))
    print(f"export: {n} samples ({tokens} tokens, {sum(1 for e in data for y in e.labels if y != -100)} trained) "
          f"from {args.trees} synthetic trees; model {MODEL.name}; {args.epochs} epochs, LR {args.lr}, "
          f"{args.threads} threads; loss before {before:.4f}")
    kinds = [k.strip() for k in args.runs.split(",") if k.strip()]
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for kind in kinds:
            r = subprocess.run([sys.executable, "-m", "bench.bench_trainers", "--run", kind, "--data", str(data_file),
                                "--epochs", str(args.epochs), "--lr", str(args.lr), "--max_length", str(args.max_length),
                                "--trl_batch", str(args.trl_batch), "--threads", str(args.threads),
                                "--loss_before", str(before)], capture_output=True, text=True, cwd=ROOT)
            if r.returncode:
                sys.exit(f"{kind} failed:\n{r.stderr[-3000:]}")
            row = json.loads(r.stdout.strip().splitlines()[-1])
            if kind not in best or row["epoch_s"] < best[kind]["epoch_s"]:
                best[kind] = row
    how = {"cpu": "CPU trainer: one task's samples up to MAX_LENGTH tokens, shared prefix once",
           "trl": f"TRL SFTTrainer: {args.trl_batch} samples per step, padded",
           "trl-accum": f"TRL SFTTrainer: 1 sample x {args.trl_batch} accumulated per step",
           "plain": f"bare PyTorch loop, {args.trl_batch} samples per step, padded (no TRL)"}
    print("| trainer | batching | steps | s / epoch | tokens / s | last step loss | loss after (same eval) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind in kinds:
        r = best[kind]
        print(f"| {kind} | {how[kind]} | {r['steps']} | {r['epoch_s']:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['last_step_loss']:.4f} | {r['loss_after']:.4f} |")
    if "cpu" in best:
        for kind in kinds:
            if kind != "cpu":
                print(f"{kind}: {best[kind]['epoch_s'] / best['cpu']['epoch_s']:.2f}x the CPU trainer's time per epoch")


if __name__ == "__main__":
    main()
