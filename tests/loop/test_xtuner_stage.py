"""TRAINER=xtuner: the loop's training stage runs xtuner_config/train.sh in the
training environment as a subprocess (real XTuner on CPU, with the tests' CPU
config and shims passed the way a user would) and reads its steps and losses."""
from __future__ import annotations

import json

from agent_r.loop import IterateSettings
from agent_r.loop.models import ModelPool
from agent_r.loop.train import train_stage
from agent_r.settings import parse
from tests.training.conftest import CPU_CONFIG, SUPPORT, TRAIN_VENV
from tests.training.samples import export_samples


def test_xtuner_trainer_runs_train_sh_in_the_training_env(tmp_path, tiny_model_dir, monkeypatch):
    """TRAINER=xtuner: xtuner_config/train.sh in .venv-train, as on a cluster
    (here with the tests' CPU config and shims, passed the way a user would)."""
    data = tmp_path / "train.json"
    data.write_text(json.dumps(export_samples()[:2] * 4))
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
    monkeypatch.setenv("MAP_NUM_PROC", "1")
    monkeypatch.setenv("PACK", "0")   # one sample per step: 24 steps, losses logged at 10 and 20
    s = parse(IterateSettings, [], environ={"TRAINER": "xtuner", "TRAIN_VENV": str(TRAIN_VENV),
                                            "CONFIG": str(CPU_CONFIG), "DEEPSPEED": "none", "EPOCHS": "3",
                                            "LR": "1e-3", "ACCUMULATIVE_COUNTS": "1", "WARMUP_RATIO": "0",
                                            "MAX_LENGTH": "512", "MODEL_DIR": tiny_model_dir})
    stats = train_stage(s, ModelPool(0, 512), "xtuner", tiny_model_dir, [str(data)], tmp_path / "model")
    assert stats["trainer"] == "xtuner" and stats["steps"] == 24 and stats["last_loss"] < stats["first_loss"]
    hf = tmp_path / "model" / "hf"
    assert (hf / "config.json").exists() and list(hf.glob("*.safetensors"))
    assert "next iteration: export MODEL_DIR=" in (tmp_path / "model" / "train.log").read_text()
