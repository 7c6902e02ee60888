"""Full fine-tuning with TRL's SFTTrainer (``TRAINER=trl``) on the exported
XTuner JSON, with exactly XTuner's per-turn labels.

    MODEL_DIR=MODEL [LR=... EPOCHS=...] python -m agent_r.training.trl_sft --data train.json --out OUT
    accelerate launch --num_processes 8 [--config_file training_configs/zero2.yaml] \
        -m agent_r.training.trl_sft --data train.json --out OUT                       # GPUs
    torchrun --standalone --nproc_per_node 2 -m agent_r.training.trl_sft ...       # CPU processes (gloo)

Why a third trainer: XTuner pins transformers 4.48 and needs its own
environment; the CPU trainer is a hand loop for tiny models. TRL runs in the
collection environment, on CPU or GPUs, one process or many (accelerate: DDP,
DeepSpeed ZeRO, FSDP), with TensorBoard logging and checkpoints for free.

What must not differ from XTuner and from inference is which token is
learned in which context. So TRL never tokenizes: each sample is encoded once
by the CPU trainer's encoder (the model's own chat format, ``ChatFormat``:
each turn's prompt and answer tokenized apart, only ``loss: true`` assistant
turns and the model's end-of-turn token trained, cut at ``max_length``,
samples with nothing to train dropped; for Llama-3 and ChatML models exactly
XTuner's ``llama3_chat``/``qwen_chat`` encoding) and handed to SFTTrainer as
``input_ids`` + ``labels``. TRL 1.16 takes a ``labels`` column as it is
(its collator pads it with -100), so the labels XTuner builds are the labels
the model is trained on; tests/training_trl checks this against XTuner itself.
General data is mixed at ETA by the XTuner config's own loader.

Differences from XTuner, on purpose or forced: no packing (one sample per
sequence; ``batch_size`` counts samples, not packed 4096-token blocks, so a
run has more, smaller steps than XTuner's PACK=1); the loss of a step is the
mean over all its trained tokens (TRL/transformers), where XTuner averages
per-batch means; warm-up rises linearly from 0 over ceil(WARMUP_RATIO x steps)
steps (XTuner: from 1e-5 x LR), then cosine to 0.

Output folder ``--out``: ``hf/`` (model + tokenizer, complete or absent; the
tokenizer files are copied from the source model, so XTuner's transformers
4.48 reads them too), ``loss_history.json`` (step, epoch, loss, learning
rate, grad norm per logged step), ``train_stats.json`` (written last: the run
is finished), ``trainer/`` (checkpoints for resuming a killed run, removed
when it finishes; TensorBoard logs under ``trainer/runs`` with REPORT_TO).
Writing that folder, resuming a killed run and refusing a folder that holds
another run are ``agent_r/training/resume.py``'s, shared with ``eto.py``.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from agent_r.knobs import BUNDLED_MODEL_DIR, ModelDir, group_values
from agent_r.settings import UsageError, nested, parse, run_cli, setting
# What must equal XTuner comes from one place each: XTuner's encoding (the
# CPU trainer's), the rows and ETA mixing (the XTuner config's loader), the
# knobs and their defaults (declared once, agent_r/training/settings.py).
from agent_r.training.cpu import examples
from agent_r.training.data import training_records
from agent_r.training.resume import Run, cuda, is_main_process, precision, run_key, train_once
from agent_r.training.settings import TrainKnobs, TrainSeed, TrlKnobs, check_warmup
from agent_r.training.trl_shared import (checkpointing_kwargs, load_tokenizer, quiet_logs,
                                         tensorboard_dir, threads_setting)

log = logging.getLogger(__name__)


@dataclass
class TrlConfig(TrlKnobs, TrainSeed, TrainKnobs):
    """Every knob of a TRL fine-tuning run: the knobs every trainer reads
    (TrainKnobs, SEED), the TRL-only ones (TrlKnobs), and ``--threads``."""

    threads: int = threads_setting()

    def check(self) -> None:
        check_warmup(self)

    @classmethod
    def from_knobs(cls, knobs: TrainKnobs, seed: int = 0, trl: Optional[TrlKnobs] = None,
                   **overrides: Any) -> "TrlConfig":
        """The loop's training knobs and seed (and its TRL knobs, else their
        defaults), then ``overrides``."""
        return cls(**{**group_values(knobs), **(group_values(trl) if trl else {}), "seed": seed, **overrides})


@dataclass
class TrlCommand(ModelDir):
    """``python -m agent_r.training.trl_sft`` (flag > environment > default;
    MODEL_DIR, the model fine-tuned, defaults to the bundled model as for
    every script)."""

    data: Optional[list[str]] = setting(None, help="the JSON files of `path_collection.py export --format xtuner` "
                                        "(required)")
    out: Optional[str] = setting(None, help="the run's folder: hf/, loss_history.json, train_stats.json (required)")
    train: TrlConfig = nested(TrlConfig)

    def finish(self) -> None:
        missing = [f"--{n}" for n in ("data", "out") if not getattr(self, n)]
        if missing:
            raise UsageError(f"python -m agent_r.training.trl_sft needs {', '.join(missing)} (see --help)")
        self.model_dir = self.model_dir or str(BUNDLED_MODEL_DIR)
        self.train.check()


# --------------------------------------------------------------------------- data

def xtuner_dataset(data_files: list[str], tokenizer: Any, cfg: TrlConfig) -> Any:
    """The samples XTuner would train on (agent + general at ETA, PACK=0), as
    a ``datasets.Dataset`` of ``input_ids`` and ``labels``."""
    from datasets import Dataset

    records, _ = training_records(data_files, cfg.general_data, cfg.eta, cfg.seed)
    data = examples(records, tokenizer, cfg.max_length)
    if not data:
        raise UsageError(f"{', '.join(data_files)}: no sample has a trained token within MAX_LENGTH="
                         f"{cfg.max_length}: export with --tokenizer and the same --max_length")
    return Dataset.from_dict({"input_ids": [e.ids for e in data], "labels": [e.labels for e in data]})


# --------------------------------------------------------------------------- trainer

def sft_args(out: Path, cfg: TrlConfig) -> Any:
    from trl import SFTConfig

    prec = precision(cfg)
    return SFTConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.accumulative_counts,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio,          # below 1: a fraction of the steps
        weight_decay=cfg.weight_decay,
        adam_beta1=0.9, adam_beta2=0.999,
        max_grad_norm=cfg.max_grad_norm,
        bf16=prec == "bf16", fp16=prec == "fp16",
        **checkpointing_kwargs(SFTConfig, cfg),
        max_length=cfg.max_length,               # samples are already cut there; TRL's cut is a no-op
        packing=False,
        shuffle_dataset=False,                   # the sampler shuffles each epoch (seeded)
        dataset_num_proc=None,
        seed=cfg.seed,
        logging_steps=cfg.logging_steps,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=None if cfg.save_total_limit < 0 else cfg.save_total_limit,
        use_cpu=not cuda(),                      # CPU processes under torchrun then meet on gloo
        dataloader_num_workers=0,
        dataloader_pin_memory=cuda(),
        ddp_find_unused_parameters=False,
        disable_tqdm=True,                       # logs go through quiet_logs(), to stderr
    )


def prepare(model_dir: str, data_files: list[str], out_dir: str, cfg: TrlConfig) -> Run:
    """The SFTTrainer of the run, built but not started."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(out_dir)
    tokenizer = load_tokenizer(model_dir)
    dataset = xtuner_dataset(data_files, tokenizer, cfg)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tensorboard_dir(out / "trainer" / "runs"):
        trainer = quiet_logs(SFTTrainer(model=model, args=sft_args(out, cfg), train_dataset=dataset,
                                        processing_class=tokenizer))
    tokens = sum(len(ids) for ids in dataset["input_ids"])
    return Run(trainer, len(dataset), tokens, out, model_dir)


# --------------------------------------------------------------------------- the run

def fine_tune(model_dir: str, data_files: list[str], out_dir: str, cfg: TrlConfig) -> dict:
    """Fully fine-tune ``model_dir`` on the export files into ``out_dir/hf``;
    return the run's statistics (the CPU trainer's keys, ``trainer: trl``).
    A rerun returns a finished run's stats, or resumes a killed one from its
    last checkpoint; ``out_dir`` holding a run of other settings is refused."""
    cfg.check()
    general = [cfg.general_data] if cfg.general_data and cfg.eta > 0 else []
    key = run_key(model_dir, list(data_files) + general, cfg)
    return train_once(Path(out_dir), key, lambda: prepare(model_dir, data_files, out_dir, cfg), cfg,
                      {"trainer": "trl"})


# --------------------------------------------------------------------------- command

def knob_env(cfg: Any) -> dict[str, str]:
    """The knobs of ``cfg`` that are environment variables, as their values."""
    return {f.metadata["env"]: str(getattr(cfg, f.name)) for f in fields(cfg) if f.metadata.get("env")}


def command_argv(model_dir: str, data_files: list[str], out_dir: str, cfg: TrlConfig, processes: int = 1,
                 accelerate_config: Optional[str] = None, port: Optional[int] = None,
                 python: str = sys.executable) -> list[str]:
    """The command that runs this training in ``processes`` processes: one
    is a plain ``python -m``; several are ``accelerate launch`` on GPUs (or
    with ``accelerate_config``, e.g. DeepSpeed ZeRO-2) and ``torchrun`` on CPU
    (accelerate's CPU launcher needs MPI), where the processes meet on gloo.
    It starts with ``env KNOB=value ...`` for every knob (flags for the rest),
    so the caller's environment cannot change one; launchers pass the
    environment on to every process."""
    knobs = [f"{k}={v}" for k, v in {"MODEL_DIR": model_dir, **knob_env(cfg)}.items()]
    flags = [f"--{f.name}={getattr(cfg, f.name)}" for f in fields(cfg) if not f.metadata.get("env")]
    args = ["-m", "agent_r.training.trl_sft", "--data", *data_files, "--out", out_dir, *flags]
    if processes <= 1 and not accelerate_config:
        return ["env", *knobs, python, *args]
    if not accelerate_config and not cuda():
        rendezvous = ["--master_port", str(port)] if port else ["--standalone"]
        return ["env", *knobs, python, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                *rendezvous, *args]
    launch = [python, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
    if port:
        launch += ["--main_process_port", str(port)]
    if accelerate_config:
        launch += ["--config_file", accelerate_config]
    return ["env", *knobs, *launch, *args]


def main(argv: Optional[list[str]] = None) -> int:
    c = parse(TrlCommand, argv, description=__doc__, prog="python -m agent_r.training.trl_sft")
    stats = fine_tune(c.model_dir, c.data, c.out, c.train)
    if is_main_process():
        print(f"fine-tuned {c.model_dir}: {stats['samples']} samples, {stats['steps']} steps, loss "
              f"{stats['first_loss']} -> {stats['last_loss']}, {stats['processes']} process(es)")
        print(f"next iteration: export MODEL_DIR={stats['hf']}")
    return 0


if __name__ == "__main__":
    run_cli(main)
