"""LoRA through the CPU trainer: only the adapter trains, the adapter folder
is small and records the merged weights' checksum, and merging the adapter
into the untouched base (what a fresh clone does with the committed SmolLM2
adapter) gives exactly the model the trainer wrote, which learned its sample."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.io import file_sha256
from agent_r.settings import UsageError
from agent_r.training.adapter import CHECKSUM, Lora, apply_adapter
from agent_r.training.cpu import fine_tune
from agent_r.training.settings import TrainKnobs
from tests.support.chat_families import build_family_model
from tests.training.test_chat_formats import SAMPLE, greedy_turn


def test_a_lora_run_writes_an_adapter_that_rebuilds_the_trained_model(tmp_path):
    base = build_family_model(tmp_path / "base", "chatml", hidden=128)
    before = file_sha256(Path(base) / "model.safetensors")
    data = tmp_path / "one.json"
    data.write_text(json.dumps([{"messages": SAMPLE}]))
    knobs = TrainKnobs(lr=1e-2, epochs=40, batch_size=1, accumulative_counts=1, warmup_ratio=0.0, max_length=512,
                       general_data="", eta=0.0)
    stats = fine_tune(base, [str(data)], str(tmp_path / "tuned"), knobs, threads=1, lora=Lora(rank=8, alpha=16),
                      adapter_dir=str(tmp_path / "adapter"))

    assert file_sha256(Path(base) / "model.safetensors") == before                # the base is untouched
    # rank 8 on q, k, v, o (128 -> 128) and gate, up, down (128 <-> 256) of 2 layers: A and B of each
    assert stats["trainable_parameters"] == 2 * 8 * (4 * (128 + 128) + 3 * (128 + 256))
    adapter = tmp_path / "adapter"
    # what the rebuild reads and nothing else (no model card: the adapter is committed)
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                         "adapter_record.json"]
    assert (adapter / "adapter_model.safetensors").stat().st_size < 0.2 * (Path(base) / "model.safetensors").stat().st_size
    record = json.loads((adapter / "adapter_record.json").read_text())
    assert record["lora"]["rank"] == 8 and record[CHECKSUM] == file_sha256(tmp_path / "tuned" / "model.safetensors")
    assert greedy_turn(str(tmp_path / "tuned"), "chatml") == (SAMPLE[-1]["content"], True)   # it learned

    sha = apply_adapter(base, adapter, tmp_path / "rebuilt")                       # a fresh clone's rebuild
    assert sha == record[CHECKSUM]
    assert greedy_turn(str(tmp_path / "rebuilt"), "chatml") == (SAMPLE[-1]["content"], True)


def test_a_full_run_ships_its_change_as_a_truncated_svd_adapter(tmp_path):
    """Only the projections train; at full rank the SVD adapter carries the
    whole change (the rebuilt model's weights equal the fully trained ones up
    to the adapter's bf16 rounding); at a low rank it keeps a measured share."""
    import torch
    from safetensors.torch import load_file

    base = build_family_model(tmp_path / "base", "chatml", hidden=64)
    data = tmp_path / "one.json"
    data.write_text(json.dumps([{"messages": SAMPLE}]))
    knobs = TrainKnobs(lr=3e-3, epochs=30, batch_size=1, accumulative_counts=1, warmup_ratio=0.0, max_length=512,
                       general_data="", eta=0.0)
    runs = {}
    for rank in (64, 2):
        out = tmp_path / f"r{rank}"
        stats = fine_tune(base, [str(data)], str(out / "tuned"), knobs, threads=1,
                          lora=Lora(rank=rank, alpha=rank, full_then_svd=True), adapter_dir=str(out / "adapter"),
                          full_dir=str(out / "full"))
        runs[rank] = stats
        # q, k, v, o (64 x 64) and gate, up, down (64 x 128) of 2 layers, trained fully
        assert stats["trainable_parameters"] == 2 * (4 * 64 * 64 + 3 * 64 * 128)
        assert json.loads((out / "adapter" / "adapter_record.json").read_text())[CHECKSUM] == file_sha256(
            out / "tuned" / "model.safetensors")
    assert runs[64]["svd_energy_kept"] == 1.0 and 0.0 < runs[2]["svd_energy_kept"] < 1.0
    full, rebuilt, pretrained = (load_file(p) for p in (
        tmp_path / "r64" / "full" / "model.safetensors", tmp_path / "r64" / "tuned" / "model.safetensors",
        Path(base) / "model.safetensors"))
    for name, weight in full.items():
        if name.endswith("q_proj.weight") or name.endswith("down_proj.weight"):
            change = (weight.float() - pretrained[name].float()).norm()
            assert change > 0
            assert (rebuilt[name].float() - weight.float()).norm() < 0.05 * change
        elif "norm" in name or "embed" in name:
            assert torch.equal(weight, pretrained[name])                  # frozen: nothing else changed
    assert greedy_turn(str(tmp_path / "r64" / "tuned"), "chatml") == (SAMPLE[-1]["content"], True)


def test_a_folder_without_an_adapter_gets_one_line(tmp_path):
    base = build_family_model(tmp_path / "base", "chatml")
    with pytest.raises(UsageError, match="is not a LoRA adapter folder"):
        apply_adapter(base, tmp_path, tmp_path / "out")


@pytest.mark.parametrize("alpha", [128, 16])
def test_an_svd_adapter_at_an_alpha_other_than_its_rank_rebuilds_the_change(tmp_path, alpha):
    """The SVD adapter divides by peft's scale alpha / rank, so a full-rank
    adapter at any alpha merges back into the changed weights (to float
    precision), and the untouched layers stay the pretrained ones."""
    import torch
    from transformers import AutoModelForCausalLM

    base = build_family_model(tmp_path / "base", "chatml", hidden=64)
    tuned = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if name.rsplit(".", 2)[-2] in Lora().targets:
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
    lora = Lora(rank=64, alpha=alpha, full_then_svd=True)
    wrapped, kept = lora.from_delta(base, tuned)
    assert kept == pytest.approx(1.0)
    merged = dict(wrapped.merge_and_unload().named_parameters())
    pretrained = dict(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).named_parameters())
    for name, weight in tuned.named_parameters():
        if name.rsplit(".", 2)[-2] in lora.targets:
            change = (weight - pretrained[name]).norm()
            assert (merged[name] - weight).norm() < 1e-4 * change, name
        else:
            assert torch.equal(merged[name], pretrained[name]), name
