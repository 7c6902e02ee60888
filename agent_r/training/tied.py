"""Tied weights stay tied on disk, and a saved config names one dtype.

    python -m agent_r.training.tied HF_DIR      # fix a model folder in place (XTuner's conversion)

A model with ``tie_word_embeddings`` (SmolLM2, Llama 3.2 1B/3B, the bundled
tiny models) has one matrix that is both the input embedding and the LM head.
Written as two tensors, it loads (transformers ties them again from the
config), but the folder carries a second copy of the embedding (28M
parameters for SmolLM2-135M's 49k x 576) and every parameter count read from
its safetensors headers (the start-up line, the manifests, the results rows)
is wrong. Two trainers wrote two:

* the TRL trainers on a GPU: the weights are cast to the training precision
  before saving, and the cast gives each name its own tensor, so
  ``save_pretrained`` no longer sees that they are one;
* XTuner's ``pth_to_hf`` on a DeepSpeed checkpoint (the default,
  ZeRO-2): the checkpoint holds both names, and the converter loads it into
  the model one tensor per name, which replaces the tied parameter by two
  (measured on CPU too; a plain, non-DeepSpeed checkpoint stays tied).

So every trainer saves through ``agent_r.training.saving.save_model``, which
leaves the tied copies out (``tied_copies``: the names the model itself
shares), and ``xtuner_config/train.sh`` runs this module on XTuner's output
(``fix_saved_model``: the same names, found on an empty copy of the model
built from its config, dropped from the shards). Both then write ``dtype``
and ``torch_dtype`` in config.json as the dtype the tensors have: transformers
5.x reads the first, 4.x (XTuner) the second, and XTuner's converted config
kept the base model's ``dtype`` next to its own ``torch_dtype``.

Imports only the standard library at module level: the training environment
(transformers 4.48) runs it too.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)

# safetensors' dtype names -> torch's
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
INDEX = "model.safetensors.index.json"


def tied_copies(model: Any) -> dict[str, str]:
    """{name: the name it is saved under} for every parameter that is the
    same tensor as one named before it (a tied LM head is the embedding)."""
    first: dict[int, str] = {}
    copies = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            copies[name] = first[id(param)]
        else:
            first[id(param)] = name
    return copies


def without_copies(state: dict, copies: dict[str, str]) -> dict:
    """``state`` less each tied copy whose kept name it also holds."""
    return {k: v for k, v in state.items() if not (k in copies and copies[k] in state)}


def header(path: Path) -> dict:
    """The safetensors header of ``path`` (names, dtypes, shapes), without reading the weights."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(size))


def tensor_dtype(folder: Path) -> Optional[str]:
    """The one floating dtype of the folder's weights, None when they mix dtypes or hold none."""
    found = {SAFETENSORS_DTYPES.get(t["dtype"], t["dtype"]) for path in sorted(folder.glob("*.safetensors"))
             for name, t in header(path).items() if name != "__metadata__" and t["dtype"].startswith(("F", "BF"))}
    return found.pop() if len(found) == 1 else None


def set_config_dtype(folder: Path, dtype: Optional[str] = None) -> Optional[str]:
    """config.json's ``dtype`` and ``torch_dtype`` set to ``dtype`` (default:
    the weights' own); returns what was written, None when the weights mix
    dtypes and none was given (the config is then left as it is)."""
    dtype = dtype or tensor_dtype(folder)
    if dtype is None:
        return None
    path = folder / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["dtype"] = cfg["torch_dtype"] = dtype
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return dtype


def drop_tied_copies(folder: Path, copies: dict[str, str]) -> list[str]:
    """Rewrite the shards of ``folder`` without the tied copies (each only
    where its kept name is saved too) and the shard index to match; returns
    the names dropped."""
    from safetensors.torch import load_file, save_file

    shards = sorted(folder.glob("*.safetensors"))
    saved = {name for path in shards for name in header(path) if name != "__metadata__"}
    drop = {name for name, kept in copies.items() if name in saved and kept in saved}
    freed = 0
    for path in shards:
        names = set(header(path)) - {"__metadata__"}
        if not names & drop:
            continue
        tensors = load_file(str(path))
        for name in names & drop:
            freed += tensors[name].numel() * tensors[name].element_size()
            del tensors[name]
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=header(path).get("__metadata__") or {"format": "pt"})
        tmp.replace(path)
    index = folder / INDEX
    if drop and index.exists():
        data = json.loads(index.read_text(encoding="utf-8"))
        data["weight_map"] = {k: v for k, v in data.get("weight_map", {}).items() if k not in drop}
        if isinstance(data.get("metadata", {}).get("total_size"), int):
            data["metadata"]["total_size"] -= freed
        index.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return sorted(drop)


def empty_model(folder: Path) -> Any:
    """The folder's model built on the meta device from its config: its
    parameter names and which of them are tied, without memory or weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def fix_saved_model(folder: Path) -> dict:
    """A converted model folder with its tied weights saved once and one
    dtype in its config; returns what was done."""
    copies = tied_copies(empty_model(folder))
    dropped = drop_tied_copies(folder, copies)
    dtype = set_config_dtype(folder)
    for name in dropped:
        log.info("%s: left out %s, a tied copy of %s", folder, name, copies[name])
    return {"dropped": dropped, "dtype": dtype}


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "config.json").is_file():
        print("usage: python -m agent_r.training.tied HF_DIR (a saved model folder with config.json)",
              file=sys.stderr)
        return 2
    done = fix_saved_model(Path(args[0]))
    print(f"{args[0]}: tied copies left out: {', '.join(done['dropped']) or 'none'}; config dtype: "
          f"{done['dtype'] or 'unchanged (mixed dtypes)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
