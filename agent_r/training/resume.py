"""A TRL fine-tuning run's folder: resume a run that was cut off, and never
mix two runs.

A fine-tune on GPUs runs for hours and is killed (a SLURM time limit, a
pre-emption, Ctrl-C); rerunning the same command must continue from the last
checkpoint under ``out/trainer`` rather than start over, and rerunning a
finished one must return its stats without training again. A folder that
holds a run with other inputs (model, data files by content, or any knob that
changes the trained model) is refused rather than resumed into a mix.

``train_once`` is that lifecycle for both TRL trainers (SFT in
``trl_sft.py``, ETO's DPO in ``eto.py``): each builds its trainer (``Run``)
and computes its ``run_key``; this module checks the key, resumes, trains,
writes ``hf/`` (``save_hf``), ``loss_history.json`` and, last,
``train_stats.json``. Every process of a multi-process run calls it; the main
one (``is_main_process``) writes. The run's device and precision (``cuda``,
``precision``) live here because the saved weights take the training
precision.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from agent_r.io import atomic_write_json, file_sha256
from agent_r.settings import UsageError
from agent_r.training.adapter import lora_record, save_merged
from agent_r.training.saving import save_model
from agent_r.training.settings import TrlKnobs


log = logging.getLogger(__name__)

DONE = "train_stats.json"
HISTORY = "loss_history.json"
RUN_KEY = "run.json"
# Settings that cannot change the trained model: a rerun may change them and still resume.
NOT_IN_KEY = ("threads", "report_to", "save_steps", "save_total_limit", "logging_steps")
# How a refusal names the parts of a run key other than its knobs.
KEY_PARTS = {"data": "the data", "model_dir": "the model", "ref_model_dir": "the reference model"}


@dataclass
class Run:
    """A built trainer and what the run reports about its data."""

    trainer: Any
    samples: int
    tokens: int
    out: Path
    model_dir: str
    lora: Any = None      # agent_r.training.adapter.Lora: the trainer's model is a peft model training it


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def precision(cfg: TrlKnobs) -> str:
    if cfg.precision != "auto":
        return cfg.precision
    import torch

    return "bf16" if cuda() and torch.cuda.is_bf16_supported() else "fp32"


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def save_hf(run: Run, cfg: TrlKnobs) -> Path:
    """``out/hf``: weights gathered from every process (ZeRO-3/FSDP too),
    written by the main one beside ``hf`` and renamed; tokenizer files from
    the source model; config keys transformers 4.x (XTuner) reads."""
    import torch

    trainer, out = run.trainer, run.out
    state = trainer.accelerator.get_state_dict(trainer.model)     # every process must take part
    hf = out / "hf"
    if trainer.is_world_process_zero():
        dtype_name = DTYPES[precision(cfg) if cfg.save_dtype == "auto" else cfg.save_dtype]
        dtype = getattr(torch, dtype_name)
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        save_model(trainer.accelerator.unwrap_model(trainer.model), Path(run.model_dir), hf, state, dtype_name)
    trainer.accelerator.wait_for_everyone()
    return hf


def save_lora(run: Run) -> Path:
    """``out/adapter`` (the trained adapter, its record naming the merged
    weights' sha256) and ``out/hf``, the start model with it merged."""
    trainer, out = run.trainer, run.out
    if trainer.is_world_process_zero():
        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        save_merged(peft_model, run.model_dir, out / "adapter", out / "hf",
                    {**lora_record(run.lora), "base": run.model_dir})
    trainer.accelerator.wait_for_everyone()
    return out / "hf"


SFT_LOGGED = ("step", "epoch", "loss", "learning_rate", "grad_norm")


def loss_history(log_history: list[dict], keep: tuple[str, ...] = SFT_LOGGED) -> list[dict]:
    """One row per logged step: the loss, the learning rate the step used, the grad norm (and ``keep``)."""
    return [{k: row[k] for k in keep if k in row} for row in log_history if "loss" in row]


def run_key(model_dir: str, files: list[str], cfg: Any) -> dict:
    """What decides the trained model: a rerun with another key must not resume this one."""
    knobs = {k: v for k, v in asdict(cfg).items() if k not in NOT_IN_KEY}
    data = [{"path": str(Path(p).resolve()), "sha256": file_sha256(p)} for p in files if p and Path(p).is_file()]
    return {"model_dir": str(Path(model_dir).resolve()), "data": data, "config": knobs}


def check_resume(out: Path, key: dict) -> Optional[dict]:
    """The finished run's stats, or None to (re)start; refuses a folder that holds another run."""
    path = out / RUN_KEY
    if not path.exists():
        return None
    held = json.loads(path.read_text(encoding="utf-8"))
    if held != key:
        diff = sorted(k for k in set(held.get("config", {})) | set(key["config"])
                      if held.get("config", {}).get(k) != key["config"].get(k))
        what = ", ".join(diff) or ", ".join(KEY_PARTS.get(k, k) for k in sorted(set(held) | set(key))
                                            if k != "config" and held.get(k) != key.get(k))
        raise UsageError(f"--out {out} holds a run with other settings ({what}): pass another --out, or "
                         "delete the folder to start over")
    done = out / DONE
    if done.exists() and (out / "hf" / "config.json").exists():
        return json.loads(done.read_text(encoding="utf-8"))
    return None


def last_checkpoint(out: Path) -> Optional[str]:
    from transformers.trainer_utils import get_last_checkpoint

    folder = out / "trainer"
    return get_last_checkpoint(str(folder)) if folder.is_dir() else None


def is_main_process() -> bool:
    """Rank 0 of the run's process group, as torch.distributed (or an
    accelerate state the trainer made) knows it. The group exists once a
    trainer is built: accelerate sets it up then, with the backend the run's
    device needs (made earlier here, it would fix the wrong one). Before that
    (a finished run's rerun returns without building one) every process
    counts as the main one; nothing is written on that path."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    from accelerate.state import PartialState, is_initialized

    return PartialState().is_main_process if is_initialized() else True


def mean(xs: list[float]) -> Optional[float]:
    return round(sum(xs) / len(xs), 4) if xs else None


def train_once(out: Path, key: dict, build: Callable[[], Run], cfg: Any, stats: dict,
               logged: tuple[str, ...] = SFT_LOGGED) -> dict:
    """Build, train (resuming from the last checkpoint), save ``out/hf``,
    write the loss history and the stats (last); a finished run is returned
    as it is. Every process runs this; the main one writes."""
    started = time.time()
    finished = check_resume(out, key)
    if finished is not None:
        if is_main_process():
            log.info("%s is finished (%s): not training again", out, DONE)
        return finished
    run = build()
    main = run.trainer.is_world_process_zero()
    if main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / RUN_KEY, key, indent=2)
    resume = last_checkpoint(out)
    if resume and main:
        log.info("resuming from %s", resume)
    result = run.trainer.train(resume_from_checkpoint=resume)
    hf = save_lora(run) if run.lora is not None else save_hf(run, cfg)
    history = loss_history(run.trainer.state.log_history, logged)
    losses = [row["loss"] for row in history]
    tenth = max(1, len(losses) // 10)
    world = run.trainer.accelerator.num_processes
    stats = {**stats, "samples": run.samples, "steps": run.trainer.state.global_step,
             "tokens": run.tokens * cfg.epochs, "first_loss": mean(losses[:tenth]), "last_loss": mean(losses[-tenth:]),
             "seconds": round(time.time() - started, 1), "train_runtime": round(result.metrics["train_runtime"], 2),
             "processes": world, "global_batch": cfg.batch_size * cfg.accumulative_counts * world,
             "hf": str(hf), "config": asdict(cfg)}
    if main:
        atomic_write_json(out / HISTORY, history, indent=1)
        for ckpt in (out / "trainer").glob("checkpoint-*"):
            shutil.rmtree(ckpt, ignore_errors=True)      # only a killed run needs them
        atomic_write_json(out / DONE, stats, indent=2)
        log.info("trained %s on %d samples: %d steps, loss %.3f -> %.3f", run.model_dir, run.samples,
                 stats["steps"], stats["first_loss"], stats["last_loss"])
    run.trainer.accelerator.wait_for_everyone()
    return stats

