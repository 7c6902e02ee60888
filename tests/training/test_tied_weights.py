"""A tied embedding/LM head stays one tensor on disk after the CPU trainer and
after XTuner's conversion (xtuner_config/train.sh runs agent_r.training.tied
on pth_to_hf's output, which writes the pair twice and keeps the base
config's ``dtype`` beside its own ``torch_dtype``); TRL's runs are checked in
tests/training_trl/test_trl_tied.py and train.sh's own output in
tests/training/test_xtuner.py."""
from __future__ import annotations

import json
import shutil

import torch

from agent_r.llm.model_files import parameter_count
from agent_r.training import cpu
from agent_r.training.settings import TrainKnobs
from tests.support.saved_models import EMBED, HEAD, assert_saved_tied, saved_tensors
from tests.training.conftest import ROOT, TRAIN_VENV, run_train_env


def test_the_cpu_trainer_saves_the_tied_pair_once(agent_export, tiny_model_dir, tmp_path):
    knobs = TrainKnobs(lr=1e-3, epochs=1, max_length=512, batch_size=1, accumulative_counts=1, warmup_ratio=0.0,
                       general_data="", eta=0.0)
    cpu.fine_tune(tiny_model_dir, [str(agent_export)], str(tmp_path / "hf"), knobs, threads=1)
    assert_saved_tied(tmp_path / "hf", tiny_model_dir)


def test_a_converted_model_written_with_the_pair_twice_is_fixed_in_the_training_env(tiny_model_dir, tmp_path):
    """What pth_to_hf leaves (both tensors; the base's ``dtype`` float32 next
    to ``torch_dtype`` float16), fixed by the command train.sh runs, in the
    training environment's transformers 4.48."""
    from safetensors.torch import save_file

    folder = tmp_path / "converted"
    shutil.copytree(tiny_model_dir, folder)
    for stale in folder.glob("*.safetensors"):
        stale.unlink()
    weights = {k: v.to(torch.float16).contiguous() for k, v in saved_tensors(tiny_model_dir).items()}
    weights[HEAD] = weights[EMBED].clone()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "dtype": "float32", "torch_dtype": "float16"}))
    assert parameter_count(str(folder)) > parameter_count(tiny_model_dir)

    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-m", "agent_r.training.tied", str(folder)])
    assert r.stdout.strip() == f"{folder}: tied copies left out: lm_head.weight; config dtype: float16"
    assert_saved_tied(folder, tiny_model_dir)
    assert parameter_count(str(folder)) == parameter_count(tiny_model_dir)
    again = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-m", "agent_r.training.tied", str(folder)])
    assert "tied copies left out: none" in again.stdout                       # a second run changes nothing


def test_the_fix_names_its_usage_in_one_line(tmp_path):
    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-m", "agent_r.training.tied", str(tmp_path)],
                      check=False, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "usage:" in r.stderr
