"""`--dtype auto` on a CPU: bf16 for a model saved in bf16 where the CPU has
native bf16 (AMX or AVX512-BF16), fp32 for everything else; an explicit
dtype wins. The capability probe is passed in, so each case runs here
whatever this machine's CPU is; the probe itself is checked against
/proc/cpuinfo."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.llm.hf_backend import HFBackend
from agent_r.llm.model_files import cpu_auto_dtype, cpu_bf16_native, model_dtype
from agent_r.llm.vllm_backend import VLLMBackend
from tests.support.model_fixtures import build_tiny_model


def yes() -> bool:
    return True


def no() -> bool:
    return False


def config_dir(tmp_path: Path, config: dict) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("config, native, expected", [
    ({"dtype": "bfloat16"}, True, "bfloat16"),
    ({"dtype": "bfloat16"}, False, "float32"),
    ({"torch_dtype": "bfloat16"}, True, "bfloat16"),                 # saved by transformers 4.x (XTuner)
    ({"text_config": {"dtype": "bfloat16"}}, True, "bfloat16"),
    ({"dtype": "float32", "torch_dtype": "float32"}, True, "float32"),  # the bundled models
    ({"dtype": "float32"}, False, "float32"),
    ({"dtype": "float16"}, True, "float32"),                         # no native fp16 path is measured on CPU
    ({}, True, "float32"),                                           # dtype unknown
])
def test_auto_dtype_per_cpu_capability_and_model_dtype(tmp_path, config, native, expected):
    assert cpu_auto_dtype(config_dir(tmp_path, config), yes if native else no) == expected


def test_auto_dtype_of_a_hub_id_or_missing_folder_is_float32():
    assert model_dtype("org/name") is None
    assert cpu_auto_dtype("org/name", yes) == "float32"


def test_the_bundled_models_stay_float32_on_a_bf16_cpu():
    root = Path(__file__).resolve().parents[2] / "models"
    for name in ("textcraft-tiny", "textcraft-base"):
        assert cpu_auto_dtype(str(root / name), yes) == "float32"


def test_the_probe_agrees_with_the_cpu_flags_linux_reports():
    flags_file = Path("/proc/cpuinfo")
    if not flags_file.exists():
        pytest.skip("no /proc/cpuinfo on this OS")
    flags = {f for line in flags_file.read_text().splitlines() if line.startswith("flags")
             for f in line.split(":", 1)[1].split()}
    if not any(line.startswith("flags") for line in flags_file.read_text().splitlines()):
        pytest.skip("/proc/cpuinfo has no x86 flags line (not an x86 CPU)")
    assert cpu_bf16_native() is bool({"amx_bf16", "avx512_bf16"} & flags)


@pytest.fixture(scope="module")
def bf16_model_dir(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("bf16") / "model", dtype="bfloat16")


def test_hf_auto_loads_a_bf16_model_in_bf16_only_where_the_cpu_has_it(bf16_model_dir, tiny_model_dir):
    import torch

    from agent_r.llm.base import GenerationRequest, SamplingConfig

    backend = HFBackend(bf16_model_dir, device="cpu", cpu_bf16=yes)
    assert backend.describe()["dtype"] == "bfloat16"
    assert {p.dtype for p in backend.model.parameters()} == {torch.bfloat16}
    reply = backend.generate([GenerationRequest([{"role": "user", "content": "Goal: craft stick."}])],
                             SamplingConfig(temperature=0.0, max_new_tokens=4))
    assert isinstance(reply[0], list) and len(reply[0]) == 1
    fp32 = HFBackend(bf16_model_dir, device="cpu", cpu_bf16=no)
    assert fp32.describe()["dtype"] == "float32" and fp32.model.dtype == torch.float32
    assert HFBackend(bf16_model_dir, device="cpu", dtype="float32", cpu_bf16=yes).model.dtype == torch.float32
    assert HFBackend(tiny_model_dir, device="cpu", cpu_bf16=yes).model.dtype == torch.float32


def test_vllm_auto_asks_the_engine_for_bf16_only_for_a_bf16_model_on_a_bf16_cpu(bf16_model_dir, tiny_model_dir,
                                                                               vllm_fake):
    def engine_dtype(model_dir: str, dtype: str, probe) -> str:
        backend = VLLMBackend(model_dir, dtype=dtype, max_model_len=512, cpu_bf16=probe)
        asked = backend.options["dtype"]
        backend.close()
        return asked

    assert engine_dtype(bf16_model_dir, "auto", yes) == "bfloat16"
    assert engine_dtype(bf16_model_dir, "auto", no) == "float32"
    assert engine_dtype(tiny_model_dir, "auto", yes) == "float32"
    assert engine_dtype(bf16_model_dir, "float32", yes) == "float32"
    assert engine_dtype(tiny_model_dir, "bfloat16", no) == "bfloat16"
