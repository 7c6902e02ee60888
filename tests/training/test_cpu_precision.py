"""The in-process trainer's precision: a model saved in bf16 trains under bf16
autocast (fp32 master weights) where the CPU has native bf16 and is saved in
bf16 again; an fp32 model trains and is saved in fp32 as before. The CPU
probe is passed in, so both cases run on any machine."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from agent_r.training import cpu
from agent_r.training.settings import TrainKnobs
from tests.support.model_fixtures import build_tiny_model
from tests.training.samples import export_samples

KNOBS = TrainKnobs(max_length=256, epochs=4, lr=2e-3, batch_size=1, accumulative_counts=1, warmup_ratio=0.0)


@pytest.fixture(scope="module")
def bf16_model_dir(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("bf16") / "model", dtype="bfloat16")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "train.json"
    path.write_text(json.dumps(export_samples()[:4]))
    return str(path)


def linear_output_dtypes(run):
    """(run's result, the dtypes every nn.Linear produced while it ran)."""
    import torch

    seen: set = set()

    def hook(module, args, output):
        if isinstance(module, torch.nn.Linear) and module.training:
            seen.add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        return run(), seen
    finally:
        handle.remove()


def saved_dtypes(folder: Path) -> tuple[set[str], set[str]]:
    """(the safetensors tensor dtypes, their names) of a saved model."""
    with open(folder / "model.safetensors", "rb") as fh:
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    header.pop("__metadata__", None)
    return {t["dtype"] for t in header.values()}, set(header)


def test_a_bf16_model_trains_under_autocast_and_is_saved_in_bf16(bf16_model_dir, data, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    stats, seen = linear_output_dtypes(
        lambda: cpu.fine_tune(bf16_model_dir, [data], str(tmp_path / "hf"), KNOBS, seed=0, cpu_bf16=lambda: True))
    assert seen == {torch.bfloat16}                       # every matmul of training ran in bf16
    assert stats["precision"] == "bf16 autocast, fp32 weights" and stats["saved_dtype"] == "bfloat16"
    assert stats["last_loss"] < 0.6 * stats["first_loss"]
    dtypes, names = saved_dtypes(tmp_path / "hf")
    assert dtypes == {"BF16"} and "lm_head.weight" not in names   # tied embeddings: one tensor
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    plain, seen = linear_output_dtypes(
        lambda: cpu.fine_tune(bf16_model_dir, [data], str(tmp_path / "fp32"), KNOBS, seed=0, cpu_bf16=lambda: False))
    assert seen == {torch.float32} and plain["precision"] == "fp32"
    assert saved_dtypes(tmp_path / "fp32")[0] == {"BF16"}      # saved in the model's own dtype either way
    # the same steps on the same data: autocast changes rounding, not what is learned
    assert stats["losses"][0] == pytest.approx(plain["losses"][0], rel=0.05)
    assert stats["last_loss"] == pytest.approx(plain["last_loss"], rel=0.25)


def test_an_fp32_model_stays_fp32_on_a_bf16_cpu(tiny_model_dir, data, tmp_path):
    import torch

    stats, seen = linear_output_dtypes(
        lambda: cpu.fine_tune(tiny_model_dir, [data], str(tmp_path / "hf"),
                              TrainKnobs(max_length=256, epochs=1, lr=1e-4, batch_size=1, accumulative_counts=1),
                              seed=0, cpu_bf16=lambda: True))
    assert seen == {torch.float32}
    assert (stats["precision"], stats["saved_dtype"]) == ("fp32", "float32")
    assert saved_dtypes(tmp_path / "hf")[0] == {"F32"}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "float32"
