"""Saving a trained model: every trainer (the CPU trainer, the TRL trainers,
an adapter's merge) writes its model folder through ``save_model``, so every
trained model loads in transformers 5.x and in XTuner's 4.48, keeps its tied
weights as one tensor and names one dtype in its config (tied.py says why).
Its own module so the trainers and the adapter code each import it and never
each other."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agent_r.training.tied import set_config_dtype, tensor_dtype, tied_copies, without_copies

# Files of a model directory that are not weights or config: copied verbatim, so
# tokenizer files stay in the form transformers 4.48 (XTuner) reads too.
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                "chat_template.jinja")


def save_model(model: Any, source: Path, out: Path, state_dict: dict | None = None,
               dtype_name: str | None = None) -> None:
    """Weights and config from the model (or ``state_dict``, e.g. gathered from
    every process and cast to the saving dtype), the other files copied from
    ``source``; written beside ``out`` and renamed, so ``out`` is complete or
    absent. Every trainer saves through here, so every trained model loads in
    both transformers 5.x and XTuner's 4.x, keeps its tied weights as one
    tensor and names one dtype in its config (agent_r/training/tied.py)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    state = without_copies(model.state_dict() if state_dict is None else state_dict, tied_copies(model))
    model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    for name in COPIED_FILES:
        if (source / name).exists():
            shutil.copy(source / name, tmp / name)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    rope = cfg.get("rope_parameters") or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))   # transformers 4.x (XTuner) reads these
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    set_config_dtype(tmp, tensor_dtype(tmp) or dtype_name or cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
