"""The loop's training stage: which trainer, and XTuner as a subprocess.

``TRAINER=xtuner`` runs ``xtuner_config/train.sh`` in the training environment
(XTuner pins transformers 4.48, so it cannot run in this process); ``cpu`` runs
the in-process trainer (agent_r/training/cpu.py); ``trl`` TRL's SFTTrainer in
this process, and the eto variant TRL's DPO (agent_r/loop/trl_stages.py). All
get the same training knobs, the nested ``TrainKnobs`` group: XTuner as the
environment variables its config reads, the others as the object itself.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Optional

from agent_r.paths import ADAPTER_DIR, CHECKPOINT_DIR, HF_DIR, XTUNER_DIR
from agent_r.loop.models import ModelPool
from agent_r.loop.settings import IterateSettings
from agent_r.loop.trl_stages import DPO_TRAINER, ETO, train_eto, train_trl
from agent_r.settings import UsageError
from agent_r.training import cpu
from agent_r.training.adapter import Lora
from agent_r.training.settings import TrainKnobs

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
TRAIN_SH = REPO / "xtuner_config" / "train.sh"


class TrainingFailed(Exception):
    """The trainer exited with an error; its log says why."""

    user_facing = True


def resolve_trainer(s: IterateSettings) -> str:
    """auto -> xtuner where CUDA is available (a cluster), else cpu."""
    if s.trainer != "auto":
        return s.trainer
    import torch

    return "xtuner" if torch.cuda.is_available() else "cpu"


def check_trainer(s: IterateSettings) -> str:
    """The trainer to use; a missing XTuner environment is a usage error now,
    not after the first search."""
    trainer = resolve_trainer(s)
    if s.lora_rank and trainer != "cpu":
        raise UsageError(f"LORA_RANK={s.lora_rank} trains adapters with the CPU trainer (and the eto variant's DPO), "
                         f"but TRAINER={s.trainer} resolves to {trainer}: set TRAINER=cpu, or LORA_RANK=0 for full "
                         "fine-tunes")
    if s.train_device == "cuda":
        import torch

        if trainer != "cpu":
            raise UsageError(f"TRAIN_DEVICE=cuda is the CPU trainer's GPU switch, but TRAINER={s.trainer} resolves to "
                             f"{trainer}: set TRAINER=cpu, or leave TRAIN_DEVICE at cpu")
        if not torch.cuda.is_available():
            raise UsageError("TRAIN_DEVICE=cuda, but torch sees no CUDA device here: train on a GPU machine, or set "
                             "TRAIN_DEVICE=cpu")
    if (trainer == "trl" or ETO in s.variant_list) and importlib.util.find_spec("trl") is None:
        raise UsageError(f"TRL is not installed (TRAINER={s.trainer}, VARIANTS={s.variants}): run `pip install -r "
                         "requirements.txt`")
    if trainer == "xtuner" and not (Path(s.train_venv) / "bin" / "python").exists():
        raise UsageError(f"the training environment {s.train_venv} is missing (TRAINER=xtuner): run `make "
                         "setup-train` (or set TRAIN_VENV to your XTuner environment), or TRAINER=cpu for tiny "
                         "models on CPU")
    return trainer


def knob_env(knobs: TrainKnobs) -> dict[str, str]:
    """The training knobs as the environment variables XTuner's config reads
    (each field's own env name)."""
    return {f.metadata["env"]: str(getattr(knobs, f.name)) for f in dataclasses.fields(knobs)}


def xtuner_losses(work_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for scalars in sorted(work_dir.glob("*/vis_data/scalars.json"))
            for line in scalars.read_text(encoding="utf-8").splitlines() if '"loss"' in line]


def train_xtuner(s: IterateSettings, start: str, data_files: list[str], out: Path,
                 knobs: Optional[TrainKnobs] = None) -> dict:
    """xtuner_config/train.sh in the training environment (the environment is
    inherited: NPROC_PER_NODE, NNODES, SAVE_FP32, PYTHONPATH ... reach it, and
    train.sh puts the repository on PYTHONPATH); writes ``out/xtuner``
    (checkpoints, resumed on a rerun) and ``out/hf``."""
    work = out / XTUNER_DIR
    values = {**knob_env(knobs or s.train), "MODEL_DIR": start, "DATA_FILES": ",".join(data_files), "SEED": str(s.seed),
              "WORK_DIR": str(work), "HF_DIR": str(out / HF_DIR), "DEEPSPEED": s.deepspeed,
              "TRAIN_VENV": str(Path(s.train_venv).resolve())}
    if s.xtuner_config:
        values["CONFIG"] = s.xtuner_config
    # The venv's bin goes first on PATH (xtuner runs a bare `python`); set in the
    # child's shell so this process never reads or copies its own environment.
    command = ["env", *[f"{k}={v}" for k, v in values.items()], "bash", "-c",
               'export PATH="$TRAIN_VENV/bin:$PATH"; unset VIRTUAL_ENV; exec bash "$0"', str(TRAIN_SH)]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "a", encoding="utf-8") as logfile:
        code = subprocess.run(command, cwd=REPO, stdout=logfile, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise TrainingFailed(f"xtuner_config/train.sh failed (exit {code}); see {out / 'train.log'}")
    losses = xtuner_losses(work)   # logged every LoggerHook interval
    last = Path((work / "last_checkpoint").read_text(encoding="utf-8").strip()).name
    tenth = max(1, len(losses) // 10)
    return {"trainer": "xtuner", "steps": int(re.sub(r"\D", "", last) or 0),
            "first_loss": round(sum(losses[:tenth]) / tenth, 4) if losses else None,
            "last_loss": round(sum(losses[-tenth:]) / tenth, 4) if losses else None, "losses": losses}


def train_stage(s: IterateSettings, pool: ModelPool, trainer: str, start: str, data_files: list[str],
                out: Path, knobs: Optional[TrainKnobs] = None) -> dict:
    """model_k in ``out/hf``, fine-tuned from ``start`` on ``data_files``
    with ``knobs`` (this iteration's: ``IterateSettings.train_knobs``)."""
    knobs = knobs or s.train_knobs(1)
    pool.close()   # the accelerator (or the CPU) is the trainer's now
    if trainer == "xtuner":
        stats = train_xtuner(s, start, data_files, out, knobs)
    elif trainer == "trl":
        return train_trl(s, start, data_files, out, knobs)
    elif trainer == DPO_TRAINER:
        return train_eto(s, start, data_files, out, knobs)
    else:
        lora = {"lora": Lora(rank=s.lora_rank, alpha=2 * s.lora_rank), "adapter_dir": str(out / ADAPTER_DIR)} \
            if s.lora_rank else {}
        stats = cpu.fine_tune(start, data_files, str(out / HF_DIR), knobs, seed=s.seed,
                              checkpoint_dir=str(out / CHECKPOINT_DIR), checkpoint_s=60 * s.checkpoint_minutes, device=s.train_device, **lora)
    stats.pop("config", None)
    stats.pop("seconds", None)   # the stage's time is recorded with every stage's
    return {**stats, "epochs": knobs.epochs, "lr": knobs.lr}
