"""The loop's TRL stages: ``TRAINER=trl`` (TRL's SFTTrainer in this process,
agent_r/training/trl_sft.py) and the ``eto`` variant (ETO's DPO on
success/failure pairs, agent_r/training/eto.py).

The eto variant searches as the others do (iteration 1 shares the base
model's trees, later iterations search with its own model_{k-1}); its data
stage pairs, per task, a full-score leaf path with a lower one of the same
tree (``eto.eto_pairs``' rules: one pair per tree, the failure cut at the
success's length + 5 rounds) and writes them, pooled over the tasks, as the
iteration's training file (``train.json``, where the other variants keep
their XTuner export). Its train stage runs DPO from the model it starts
from, with that same model as the frozen reference (ETO's), on the knobs
the loop nests (ETO_LR, ETO_BETA, ETO_EPOCHS; the step knobs of TrainKnobs;
the TRL ones). A tree without both a success and a failure gives no pair;
when no tree of the iteration gives one, the data stage says so in one
logged line and writes no file, so the variant keeps its model that
iteration (as any variant without training data does) instead of failing.
"""
from __future__ import annotations

import logging
from pathlib import Path

from agent_r.envs import get_env
from agent_r.io import atomic_write_json, read_json
from agent_r.loop.models import Policy
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stages import search_settings
from agent_r.training import eto, resume, trl_sft
from agent_r.training.adapter import Lora
from agent_r.training.settings import TrainKnobs

log = logging.getLogger(__name__)

ETO = "eto"                  # the variant
DPO_TRAINER = "trl-dpo"      # what the eto variant's train stage runs, whatever TRAINER says
POOLED_PAIRS = "eto_pairs.json"   # TRAIN_FROM=base: the pairs of iterations 1..k, in the model folder
# Wall times and paths: a results row holds what the run's settings decide, the same on every rerun.
DROPPED = ("config", "seconds", "train_runtime", "hf")


def loss_history(out: Path) -> list[float]:
    """The loss of every logged step (``out/loss_history.json``), as the stage's ``losses``."""
    path = out / resume.HISTORY
    return [row["loss"] for row in read_json(path)] if path.exists() else []


def stage_stats(stats: dict, out: Path) -> dict:
    kept = {k: v for k, v in stats.items() if k not in DROPPED}
    return {**kept, "losses": loss_history(out)}


# --------------------------------------------------------------------------- TRAINER=trl

def train_trl(s: IterateSettings, start: str, data_files: list[str], out: Path, knobs: TrainKnobs) -> dict:
    """model_k in ``out/hf``: TRL's SFTTrainer on the export files with the
    loop's TrainKnobs, seed and TRL knobs (resumes a killed run from its
    last checkpoint under ``out/trainer``)."""
    cfg = trl_sft.TrlConfig.from_knobs(knobs, s.seed, s.trl)
    stats = stage_stats(trl_sft.fine_tune(start, data_files, str(out), cfg), out)
    return {**stats, "epochs": cfg.epochs, "lr": cfg.lr}


# --------------------------------------------------------------------------- the eto variant

def data_stage(s: IterateSettings, trees: Path, out: Path, p: Policy, train_file: Path) -> dict:
    """Every task's ETO pairs from the trees ``p`` searched, pooled into
    ``train_file``; none at all: one logged line and no file."""
    stats, pairs = {}, []
    for task in s.tasks:
        folder = search_settings(s, task, trees, p).out_dir()
        found = eto.trees_under(folder)
        got = eto.pairs_of_trees(found, get_env(task).max_score, seed=s.seed)
        for pair in got:
            pair["id"] = f"{task}/{pair['id']}"
        stats[task] = {"trees": len(found), "trees_with_pair": len({q["id"].rsplit("/", 1)[0] for q in got}),
                       "eto_pairs": len(got), "rejected_cut": sum(q["rejected_cut"] for q in got)}
        pairs += got
    out.mkdir(parents=True, exist_ok=True)
    if pairs:
        atomic_write_json(train_file, pairs, indent=None)
    else:
        train_file.unlink(missing_ok=True)
        log.warning("eto: no tree under %s has both a full-score path and a lower one, and ETO pairs a success with "
                    "a failure of the same task: the eto variant keeps its model this iteration (search more: ITERA, "
                    "N_GEN, more tasks)", trees)
    return {"tasks": stats, "train_samples": len(pairs)}


def pooled_pairs(files: list[str], out: Path) -> str:
    """One pairs file: the only one, or several (TRAIN_FROM=base) joined into ``out/eto_pairs.json``."""
    if len(files) == 1:
        return files[0]
    joined = out / POOLED_PAIRS
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(joined, [pair for f in files for pair in read_json(f)], indent=None)
    return str(joined)


def eto_config(s: IterateSettings, knobs: TrainKnobs) -> eto.EtoConfig:
    """The DPO run's settings: the step knobs of ``knobs``, ETO_EPOCHS,
    ETO_LR, ETO_BETA, the TRL knobs and the loop's seed (what the eto row
    reports, too)."""
    return eto.EtoConfig.from_knobs(knobs, s.eto, s.seed, s.trl)


def eto_settings(cfg: eto.EtoConfig) -> dict:
    """What the eto variant's results row and stage statistics say it trained with."""
    return {"epochs": cfg.epochs, "lr": cfg.lr, "beta": cfg.beta}


def train_eto(s: IterateSettings, start: str, pairs_files: list[str], out: Path, knobs: TrainKnobs) -> dict:
    """model_k in ``out/hf``: DPO from ``start`` against ``start`` itself on the pairs."""
    cfg = eto_config(s, knobs)
    lora = Lora(rank=s.lora_rank, alpha=2 * s.lora_rank) if s.lora_rank else None
    stats = eto.train_dpo(start, pooled_pairs(pairs_files, out), str(out), cfg, ref_model_dir=start, lora=lora)
    return {**stage_stats(stats, out), **eto_settings(cfg)}
