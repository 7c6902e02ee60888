"""The self-training loop's pretrained base: SmolLM2-135M-Instruct taught the
same fixed third of the TextCraft train split as models/textcraft-base
(policy episodes and its own verifier data, the same training_tasks.json, so
the loop refuses those tasks), as a LoRA adapter trained by the project's
CPU trainer (bf16 autocast where the CPU has it; ``--device cuda`` on a GPU).

    make smollm2-base                               # apply the committed adapter (seconds)
    python -m scripts.make_smollm2_base --train 1   # rebuild the adapter from scratch (docs/models.md)
    python -m scripts.make_smollm2_base --data_only 1 --work DIR   # its training data only (general data)

Applying: ``make smollm2`` fetches SmolLM2, then the adapter in
models/smollm2-textcraft-base-adapter is merged into it and written to
models/smollm2-textcraft-base (ignored by git) with the training task list;
the merged weights' sha256 is compared with the one recorded when the
adapter was trained. A finished folder makes a rerun a no-op.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agent_r.io import atomic_write_json, file_sha256
from agent_r.llm.gguf_wheel import CACHE_DIR, SMOLLM2, SMOLLM2_DIR, get_model
from agent_r.settings import EXIT_OK, parse, run_cli, setting
from agent_r.training.adapter import CHECKSUM, Lora, apply_adapter
from agent_r.training.settings import TrainKnobs

log = logging.getLogger("make_smollm2_base")
ROOT = Path(__file__).resolve().parents[1]
TASKS_FROM = ROOT / "models" / "textcraft-base" / "training_tasks.json"   # the fixed base third
DONE = "base_provenance.json"


@dataclass
class BaseSettings:
    out: str = setting("models/smollm2-textcraft-base", help="the merged model folder (default "
                       "models/smollm2-textcraft-base)")
    adapter: str = setting("models/smollm2-textcraft-base-adapter", help="the adapter folder (committed)")
    train: bool = setting(False, help="1: train the adapter anew instead of applying the committed one (default 0)")
    work: str = setting("work_dirs/smollm2_base", help="--train, --data_only: where the training data goes")
    tokenizer: str = setting(str(SMOLLM2_DIR), help="--train, --data_only: the model folder whose tokenizer sizes the "
                             "verifier prompts (default: SmolLM2's; the base has the same)")
    data_only: bool = setting(False, help="1: only write the base's training data (policy.json, verifier_all.json: "
                              "the kept 1 in N) under WORK, as the self-training loop's general data (default 0)")
    variants: int = setting(2, help="--train: expert episodes per base task (1 = the task itself, 2 = and "
                            "another draw of its distractor recipes)")
    verifier_every: int = setting(8, help="--train: keep one in N verifier examples, a seeded random sample (the "
                                  "base third gives 1,184)")
    epochs: int = setting(2, help="--train: epochs (2: 17 of the first 30 test tasks against 12 for 1 epoch, "
                          "docs/models.md)")
    lr: float = setting(1e-3, help="--train: peak learning rate (3%% warm-up, cosine)")
    rank: int = setting(16, help="--train: LoRA rank (alpha = 2 x rank)")
    full: bool = setting(False, help="--train: 1: fine-tune the projections fully and ship the rank-RANK truncated "
                         "SVD of their change as the adapter (the fully trained model is kept in WORK/full)")
    max_length: int = setting(2048, help="--train: tokens per sample")
    batch_size: int = setting(1, help="--train: samples per batch (x max_length tokens)")
    accumulate: int = setting(2, help="--train: batches per optimizer step (2 x 2,048 tokens in 1 x 2,048-token "
                              "batches: the peak memory of one batch stays under 16 GB)")
    threads: int = setting(2, help="--train: torch threads")
    device: str = setting("cpu", help="--train: cpu, or cuda to train on a GPU (bf16 autocast; the adapter is saved "
                          "and merged on the CPU as always)")


def training_data(s: BaseSettings) -> list[str]:
    """The policy episodes and a fixed subset of the verifier examples of the
    base third, written under ``s.work``."""
    work = Path(s.work)
    work.mkdir(parents=True, exist_ok=True)
    policy, verifier = work / "policy.jsonl", work / "verifier_all.jsonl"
    run = [sys.executable, "-m"]
    subprocess.run(run + ["scripts.make_expert_data", "--tasks", str(TASKS_FROM), "--variants", str(s.variants),
                          "--renamed", "0", "--out", str(policy)], check=True, cwd=ROOT)
    subprocess.run(run + ["scripts.make_verifier_data", "--tasks", str(TASKS_FROM), "--tokenizer", s.tokenizer,
                          "--out", str(verifier)], check=True, cwd=ROOT)
    lists = []
    for source, every in ((policy, 1), (verifier, s.verifier_every)):     # the trainers read a JSON list
        rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        lists.append(work / f"{source.stem}.json")
        atomic_write_json(lists[-1], [{"messages": r["messages"]} for r in one_in(rows, every)], indent=None)
    return [str(f) for f in lists]


def one_in(rows: list, every: int, seed: int = 0) -> list:
    """A seeded sample of one row in ``every``, in file order. Not
    ``rows[::every]``: make_verifier_data writes each plan's judgements in a
    fixed pattern, and every 8th row of it was a Good one (148 of 148), which
    taught the committed base's verifier to answer Good to everything."""
    if every <= 1:
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), len(rows) // every))
    return [rows[i] for i in keep]


def train(s: BaseSettings) -> dict:
    from agent_r.training.cpu import fine_tune

    files = training_data(s)
    knobs = TrainKnobs(max_length=s.max_length, batch_size=s.batch_size, accumulative_counts=s.accumulate, warmup_ratio=0.03,
                       general_data="", eta=0.0, epochs=s.epochs, lr=s.lr)
    stats = fine_tune(str(SMOLLM2_DIR), files, s.out, knobs, seed=0, threads=s.threads,
                      lora=Lora(rank=s.rank, alpha=s.rank if s.full else 2 * s.rank, full_then_svd=s.full),
                      adapter_dir=s.adapter, full_dir=str(Path(s.work) / "full") if s.full else None,
                      device=s.device)
    adapter = Path(s.adapter)
    shutil.copy(TASKS_FROM, adapter / "training_tasks.json")
    (adapter / "README.md").unlink(missing_ok=True)   # peft's model-card template; docs/models.md describes it
    atomic_write_json(adapter / "training_stats.json", {k: v for k, v in stats.items() if k != "losses"}, indent=2)
    atomic_write_json(adapter / "losses.json", stats["losses"], indent=None)
    finish(Path(s.out), adapter, file_sha256(Path(s.out) / "model.safetensors"), stats["seconds"])
    return stats


def finish(out: Path, adapter: Path, sha: str, seconds: float) -> str:
    """The task list beside the weights (the loop refuses those tasks) and the
    folder's provenance, written last: a folder with it is complete."""
    shutil.copy(adapter / "training_tasks.json", out / "training_tasks.json")
    want = json.loads((adapter / "adapter_record.json").read_text()).get(CHECKSUM)
    note = ("weights identical to the trained model's" if sha == want else
            f"weights differ in their last bits from the trained model's ({sha[:12]} vs {str(want)[:12]}: another "
            "CPU or torch rounds the merge differently)")
    atomic_write_json(out / DONE, {"adapter": str(adapter), "adapter_sha256": file_sha256(
        adapter / "adapter_model.safetensors"), "base": str(SMOLLM2_DIR), "merged_sha256": sha,
        "seconds": seconds, "checksum": note}, indent=2)
    return note


def apply(s: BaseSettings) -> tuple[str, bool]:
    """Merge the committed adapter into SmolLM2; (note on the checksum, built?)."""
    out, adapter = Path(s.out), Path(s.adapter)
    if (out / DONE).is_file():
        return json.loads((out / DONE).read_text())["checksum"], False
    get_model(SMOLLM2, SMOLLM2_DIR, CACHE_DIR)
    started = time.time()
    sha = apply_adapter(SMOLLM2_DIR, adapter, out)
    return finish(out, adapter, sha, round(time.time() - started, 1)), True


def main(argv: list[str] | None = None) -> int:
    s = parse(BaseSettings, argv, description=__doc__, prog="python -m scripts.make_smollm2_base")
    if s.data_only:
        print(",".join(training_data(s)))
        return EXIT_OK
    if s.train:
        get_model(SMOLLM2, SMOLLM2_DIR, CACHE_DIR)
        stats = train(s)
        print(f"trained the adapter {s.adapter} ({stats['trainable_parameters'] / 1e6:.1f}M parameters) on "
              f"{stats['samples']} samples: {stats['steps']} steps, loss {stats['first_loss']} -> "
              f"{stats['last_loss']}, {stats['seconds'] / 60:.0f} min; merged into {s.out}")
        return EXIT_OK
    note, built = apply(s)
    print(f"{Path(s.out).resolve()}: {'built' if built else 'already complete, nothing done'}; {note}")
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
