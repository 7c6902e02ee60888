"""Which learning rate a run's LoRA fine-tunes use, measured: fine-tune the
start model on agent-r samples of some searched train tasks at each candidate
LR (the run's recipe otherwise) and compare the loss on the agent-r samples of
other searched train tasks, never the test split.

Why a check and not a constant: a LoRA adapter wants a far larger LR than a
full fine-tune (the SmolLM2 base's adapter was trained at 1e-3), and the
paper's batch (1 x 16 sequences of 2,048 tokens) gives a run of a few hundred
samples only a few dozen optimizer steps, so a rate that suits the base's recipe
(thousands of samples, 2 sequences a step) says little here.

Two losses per LR, both per trained token on the held-out samples: all their
trained turns, and their revision turns alone (the turn a revision sample
exists to teach). ``--train_fraction f --accumulative_counts 16f`` trains on
a seeded part of the rows at f times the batch, so the part still takes
several optimizer steps an epoch, at a fraction of the whole set's time (the
SmolLM2 check: an eighth of the rows, 14 steps against the run's 30).

    python -m scripts.lora_lr_check --train_files A.json,B.json --val_files C.json \\
        --general_data P.json,V.json --lrs 1e-4,3e-4,1e-3,3e-3 --out runs/lr_check

Each LR's result is written to OUT/lr_<lr>.json as it finishes; a rerun skips
those and prints the table of all of them.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent_r.io import atomic_write_json
from agent_r.paths import portable_paths
from agent_r.revision import is_revision_turn
from agent_r.settings import EXIT_OK, UsageError, parse, run_cli, setting
from agent_r.training.adapter import Lora
from agent_r.training.settings import TrainKnobs

log = logging.getLogger("lora_lr_check")


@dataclass
class CheckSettings:
    train_files: str = setting(help="comma-separated agent-r export files (train.json) to fine-tune on")
    val_files: str = setting(help="comma-separated agent-r export files of other tasks, to measure on")
    out: str = setting(help="the folder of the results (and of each LR's adapter)")
    model_dir: str = setting("models/smollm2-textcraft-base", help="the start model")
    general_data: str = setting("", help="general data files, mixed in at ETA as the run does")
    lrs: str = setting("1e-4,3e-4,1e-3,3e-3", help="the candidate peak learning rates, comma-separated")
    train_fraction: float = setting(1.0, minimum=0.0, help="the share of the train rows used (a seeded sample)")
    epochs: int = setting(3, minimum=1, help="epochs (the run's first iteration: 3)")
    accumulative_counts: int = setting(16, minimum=1, help="batches per optimizer step (the run's: 16)")
    rank: int = setting(16, minimum=1, help="LoRA rank (alpha = 2 x rank)")
    eta: float = setting(0.2, minimum=0.0, help="general samples per agent sample")
    seed: int = setting(0, help="the seed of the sample, the mix and the shuffle")
    threads: int = setting(0, minimum=0, help="torch threads (0: torch's default)")


def rows_of(files: str) -> list[dict]:
    rows = []
    for f in (x.strip() for x in files.split(",") if x.strip()):
        try:
            rows += json.loads(Path(f).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{f}: cannot read an export file ({exc}); pass path_collection.py's train.json files")
    return rows


def revision_only(rows: list[dict]) -> list[dict]:
    """The rows with a trained revision turn, trained on that turn alone."""
    out = []
    for r in rows:
        msgs = [{**m, "loss": bool(m.get("loss")) and is_revision_turn(m["content"])} if m["role"] == "assistant" else m
                for m in r["messages"]]
        if any(m.get("loss") for m in msgs):
            out.append({"messages": msgs})
    return out


def measure(model_dir: str, val: list[dict], val_revision: list[dict], max_length: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r.llm.model_files import cpu_bf16_native, model_dtype
    from agent_r.training.cpu import examples, held_out_loss

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    autocast = model_dtype(model_dir) == "bfloat16" and cpu_bf16_native()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = {}
    for name, rows in (("val_loss", val), ("val_revision_loss", val_revision)):
        loss, tokens = held_out_loss(model, examples(rows, tokenizer, max_length), pad, autocast)
        out[name], out[name.replace("loss", "tokens")] = round(loss, 4), tokens
    return out


def check(s: CheckSettings) -> list[dict]:
    from agent_r.training import cpu

    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    train, val = rows_of(s.train_files), rows_of(s.val_files)
    if s.train_fraction < 1:
        train = random.Random(s.seed).sample(train, max(1, round(len(train) * s.train_fraction)))
    val_revision = revision_only(val)
    if not train or not val_revision:
        raise UsageError("the check needs train rows and validation rows with a revision turn: pass other files")
    train_file = out / "train_rows.json"
    atomic_write_json(train_file, train, indent=None)
    knobs = TrainKnobs(general_data=s.general_data, eta=s.eta, epochs=s.epochs, lr=0.0,
                       accumulative_counts=s.accumulative_counts)
    results = []
    for lr in [0.0] + [float(x) for x in s.lrs.split(",") if x.strip()]:
        done = out / f"lr_{lr:g}.json"
        if done.exists():
            results.append(json.loads(done.read_text(encoding="utf-8")))
            continue
        row: dict = {"lr": lr, "train_rows": len(train), "val_rows": len(val), "val_revision_rows": len(val_revision)}
        if lr == 0:   # the start model itself
            row.update(measure(s.model_dir, val, val_revision, knobs.max_length))
        else:
            knobs.lr = lr
            work = out / f"lr_{lr:g}"
            stats = cpu.fine_tune(s.model_dir, [str(train_file)], str(work / "hf"), knobs, seed=s.seed,
                                  threads=s.threads, lora=Lora(rank=s.rank, alpha=2 * s.rank),
                                  adapter_dir=str(work / "adapter"))
            row.update({k: stats[k] for k in ("steps", "tokens", "first_loss", "last_loss", "seconds")})
            row.update(measure(str(work / "hf"), val, val_revision, knobs.max_length))
            shutil.rmtree(work / "hf")   # 270 MB a model; the adapter stays
        atomic_write_json(done, portable_paths({**row, "model_dir": s.model_dir}))
        results.append(row)
        log.info("lr %g: held-out loss %.4f, revision turns %.4f", lr, row["val_loss"], row["val_revision_loss"])
    return results


def main(argv: list[str] | None = None) -> int:
    s = parse(CheckSettings, argv, description=__doc__.split("\n\n")[0])
    results = check(s)
    print("| LR | steps | train loss first -> last | held-out loss | held-out revision-turn loss | minutes |")
    print("|---|---|---|---|---|---|")
    for r in results:
        trained = f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}" if r["lr"] else "(start model)"
        minutes = f"{r['seconds'] / 60:.0f}" if r["lr"] else ""
        print(f"| {r['lr']:g} | {r.get('steps', 0)} | {trained} | {r['val_loss']:.4f} | {r['val_revision_loss']:.4f} | {minutes} |")
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
