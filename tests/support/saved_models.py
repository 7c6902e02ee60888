"""What every trainer's saved model folder must hold: a tied embedding/LM head
written once (as many parameters on disk as the model it started from), tied
again when transformers loads it, and one dtype in config.json, the one its
tensors have. Read with safetensors itself, not with the code under test."""
from __future__ import annotations

import json
from pathlib import Path

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def saved_tensors(folder: str | Path) -> dict:
    """name -> tensor of every safetensors file in ``folder``."""
    from safetensors import safe_open

    out = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def assert_saved_tied(folder: str | Path, base: str | Path) -> None:
    """``folder`` (a trained model) saves the tied pair once, has ``base``'s
    parameter count, loads with the pair tied to the saved tensor, and its
    config names the tensors' one dtype under both keys."""
    import torch
    from transformers import AutoModelForCausalLM

    tensors, base_tensors = saved_tensors(folder), saved_tensors(base)
    assert EMBED in tensors and HEAD not in tensors, sorted(tensors)
    assert sum(t.numel() for t in tensors.values()) == sum(t.numel() for t in base_tensors.values())
    dtypes = {t.dtype for t in tensors.values()}
    assert len(dtypes) == 1, dtypes
    cfg = json.loads((Path(folder) / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True
    assert cfg["dtype"] == cfg["torch_dtype"] == str(dtypes.pop()).removeprefix("torch."), cfg
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert torch.equal(model.lm_head.weight, tensors[EMBED])
