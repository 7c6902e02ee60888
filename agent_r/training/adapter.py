"""Low-rank adapters (LoRA, with peft) for the CPU trainer: a base model
built on a pretrained LLM ships as a few MB of adapter instead of the whole
model.

Why: a fine-tuned SmolLM2-135M is 270 MB of weights, which no repository
should carry, and rebuilding it means an hour of CPU training. Its adapter
(rank 16 on every attention and MLP projection: 4.9M parameters, ~10 MB in
bf16) is small enough to commit, and ``apply_adapter`` turns the pretrained
model that ``make smollm2`` fetches plus that adapter into the trained model
in seconds. The trainer itself merges through ``apply_adapter`` too, so the
model a fresh clone rebuilds is made by the same code from the same files as
the one that was evaluated.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_r.io import file_sha256
from agent_r.paths import portable_paths
from agent_r.settings import UsageError
from agent_r.training.saving import save_model

LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CHECKSUM = "merged_sha256"   # the adapter's record of the merged weights it made
ADAPTER_RECORD = "adapter_record.json"   # beside peft's files: what the adapter was trained on, and CHECKSUM


@dataclass
class Lora:
    """LoRA settings (peft's names). Defaults: every projection of a Llama
    block, rank 16, alpha 32, no dropout (a deterministic run)."""

    rank: int = 16
    alpha: int = 32
    targets: tuple[str, ...] = field(default=LLAMA_PROJECTIONS)
    full_then_svd: bool = False   # train the projections fully, ship their change's rank-``rank`` SVD (below)

    def peft_config(self) -> Any:
        """These settings as peft's LoraConfig (what TRL's trainers take)."""
        try:
            from peft import LoraConfig
        except ImportError:
            raise UsageError("LoRA training needs the peft package: pip install -r requirements.txt") from None
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=list(self.targets), lora_dropout=0.0,
                          bias="none", task_type="CAUSAL_LM")

    def wrap(self, model: Any) -> Any:
        """``model`` with trainable adapters on its projections, everything
        else frozen; the returned peft model's inner model is ``model`` itself."""
        from peft import get_peft_model

        return get_peft_model(model, self.peft_config())


    def freeze_all_but_targets(self, model: Any) -> int:
        """For ``full_then_svd``: only the target projections train (embeddings,
        norms and the tied output head stay the pretrained ones, so the whole
        change is in matrices an adapter can carry); returns the trainable count."""
        trainable = 0
        for name, p in model.named_parameters():
            p.requires_grad = name.rsplit(".", 2)[-2] in self.targets
            trainable += p.numel() if p.requires_grad else 0
        return trainable

    def from_delta(self, base_dir: str | Path, tuned: Any) -> tuple[Any, float]:
        """A peft LoRA model on the pretrained base whose adapter is the
        rank-``rank`` truncated SVD of each projection's change (tuned -
        pretrained): B A = U_r S_r Vh_r / (alpha / rank). Why: it lets a full
        fine-tune be compared with an adapter on equal terms, and shipped in
        a committable size with ``apply_adapter`` unchanged, when the full
        model is the better one (for the SmolLM2 base it was not:
        docs/models.md). Returns (peft model, the share of the change's squared
        Frobenius norm the kept ranks carry, over all projections)."""
        import torch
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        wrapped = self.wrap(base)
        scale = self.alpha / self.rank
        kept = total = 0.0
        with torch.no_grad():
            for name, module in tuned.named_modules():
                if name.rsplit(".", 1)[-1] not in self.targets:
                    continue
                layer = wrapped.base_model.model.get_submodule(name)
                delta = module.weight.float() - layer.base_layer.weight
                u, s, vh = torch.linalg.svd(delta, full_matrices=False)
                root = s[:self.rank].sqrt()
                layer.lora_A["default"].weight.copy_(root[:, None] * vh[:self.rank])
                layer.lora_B["default"].weight.copy_(u[:, :self.rank] * root[None, :] / scale)
                kept += float((s[:self.rank] ** 2).sum())
                total += float((s ** 2).sum())
        return wrapped, kept / total if total else 1.0


def apply_adapter(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> str:
    """Merge the adapter into the base model (fp32, then the base's own dtype)
    and write the result to ``out_dir`` (complete or absent, tokenizer files
    from the base); returns the sha256 of the written weights file."""
    import torch
    from transformers import AutoModelForCausalLM

    from agent_r.llm.model_files import model_dtype

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise UsageError(f"{adapter_dir} is not a LoRA adapter folder (no adapter_config.json): pass the folder "
                         "the CPU trainer wrote with --lora")
    try:
        from peft import PeftModel
    except ImportError:
        raise UsageError("applying an adapter needs the peft package: pip install -r requirements.txt") from None
    own = model_dtype(str(base_dir)) or "float32"
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.to(getattr(torch, own))
    save_model(merged, Path(base_dir), Path(out_dir), dtype_name=own if own != "float32" else None)
    return file_sha256(Path(out_dir) / "model.safetensors")


def save_adapter(peft_model: Any, adapter_dir: Path, record: dict) -> None:
    """The adapter weights (bf16: half the size, merged in fp32 anyway),
    config and ``record`` (what it was trained on), beside and renamed; the
    base model and data named relative to the repository where they lie in
    it (``paths.portable``), as the adapter is committed."""
    import torch

    tmp = adapter_dir.with_name(adapter_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    state = {k: v.to(torch.bfloat16) for k, v in _adapter_state(peft_model).items()}
    peft_model.save_pretrained(str(tmp), state_dict=state)
    (tmp / "README.md").unlink(missing_ok=True)   # peft's template model card: nothing reads it, and it is committed
    config = json.loads((tmp / "adapter_config.json").read_text(encoding="utf-8"))
    (tmp / "adapter_config.json").write_text(json.dumps(portable_paths(config), indent=2, sort_keys=True) + "\n",
                                             encoding="utf-8")
    (tmp / ADAPTER_RECORD).write_text(json.dumps(portable_paths(record), indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(adapter_dir, ignore_errors=True)
    tmp.rename(adapter_dir)


def save_merged(peft_model: Any, base_dir: str | Path, adapter_dir: Path, out_dir: Path, record: dict) -> str:
    """A trained adapter into ``adapter_dir``, and merged into ``base_dir``
    as ``out_dir``, through the same ``apply_adapter`` a fresh machine's
    rebuild uses (so the model evaluated is the model rebuilt); the merged
    weights' sha256 goes into the record and is returned."""
    save_adapter(peft_model, adapter_dir, record)
    sha = apply_adapter(base_dir, adapter_dir, out_dir)
    record_checksum(adapter_dir, sha)
    return sha


def _adapter_state(peft_model: Any) -> dict:
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(peft_model)


def record_checksum(adapter_dir: Path, sha256: str) -> None:
    path = adapter_dir / ADAPTER_RECORD
    record = json.loads(path.read_text(encoding="utf-8"))
    record[CHECKSUM] = sha256
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def lora_record(lora: Lora) -> dict:
    return {"lora": {**asdict(lora), "targets": list(lora.targets)}}
