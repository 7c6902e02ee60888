"""Facts about a model read from its directory, before any weights load:
which directory MODEL_DIR means, its positions, its size, its dtype, whether
it may run on this machine, which dtype it runs in on this CPU, and how long
a vLLM engine for it should be."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import struct
import warnings
from pathlib import Path
from typing import Any, Callable

from agent_r.io import file_sha256
from agent_r.settings import UsageError

log = logging.getLogger(__name__)

BUNDLED_MODEL = Path(__file__).resolve().parents[2] / "models" / "textcraft-tiny"
CPU_PARAMETER_LIMIT = 1_000_000_000   # larger models need --allow_cpu 1 to run on CPU
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_dir(value: str | None) -> str:
    """MODEL_DIR semantics. ``value`` (usually the MODEL_DIR env var) unset ->
    the bundled ``models/textcraft-tiny``. An existing path -> its absolute
    form. A hub id like ``org/name`` -> unchanged (loaded from the local HF
    cache). Anything else -> UsageError saying how to fix it."""
    if value is None or not value.strip():
        if (BUNDLED_MODEL / "config.json").exists():
            return str(BUNDLED_MODEL)
        raise UsageError(
            f"MODEL_DIR is not set and the bundled model {BUNDLED_MODEL} is missing: "
            "set MODEL_DIR=/path/to/a/hf/model (a directory with config.json and tokenizer files)."
        )
    value = value.strip()
    path = Path(value).expanduser()
    if path.exists():
        return str(path.resolve())
    first = value.split("/", 1)[0]
    if _HUB_ID.match(value) and not Path(first).exists():
        return value
    raise UsageError(
        f"MODEL_DIR={value!r} does not exist: set MODEL_DIR to a directory holding a Hugging Face "
        "model (config.json + tokenizer files) or to a hub id such as meta-llama/Llama-3.1-8B-Instruct."
    )


_WEIGHTS_SHA256: dict[tuple, str] = {}


def weights_sha256(model_dir: str | None) -> str | None:
    """What a model is, whatever folder it lies in: the sha256 of its one
    safetensors file (the checksum an adapter's record names), or of its
    shards' sha256s in name order; None for a hub id or a folder without
    safetensors. Kept per process by (path, size, mtime): the loop names a
    model in several rows."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if model_dir and Path(model_dir).is_dir() else []
    if not files:
        return None
    key = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key not in _WEIGHTS_SHA256:
        hashes = [file_sha256(f) for f in files]
        _WEIGHTS_SHA256[key] = hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest()
    return _WEIGHTS_SHA256[key]


def model_config(model_dir: str) -> dict[str, Any]:
    """config.json of a local model directory ({} for a hub id or no file)."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def model_position_limit(model_dir: str) -> int | None:
    """The model's trained positions (config.json max_position_embeddings,
    also inside text_config), None when unknown."""
    config = model_config(model_dir)
    for cfg in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                return cfg[key]
    return None


def parameter_count(model_dir: str) -> int | None:
    """Parameters of a local model: summed from the safetensors headers
    (exact, reads no weights), else estimated from config.json; None when
    unknown (a hub id)."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if files:
        total = 0
        for file in files:
            with open(file, "rb") as fh:
                header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
            total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
        return total
    cfg = model_config(model_dir)
    cfg = cfg.get("text_config") or cfg
    try:
        hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        heads = cfg.get("num_attention_heads", 1)
        kv = cfg.get("num_key_value_heads", heads) * cfg.get("head_dim", hidden // heads)
        inter = cfg.get("intermediate_size", 4 * hidden)
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return embed + layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter)


def format_parameters(model_dir: str) -> str | None:
    """The model's size for the start-up line and manifests: "1.24B", "3.4M"."""
    params = parameter_count(model_dir)
    if params is None:
        return None
    return f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.1f}M"


def model_dtype(model_dir: str) -> str | None:
    """The dtype the model was saved in (config.json ``dtype``, written by
    transformers 5.x, or ``torch_dtype``, 4.x; also inside text_config), e.g.
    "bfloat16"; None when unknown (a hub id, no such key)."""
    config = model_config(model_dir)
    for cfg in (config, config.get("text_config") or {}):
        value = cfg.get("dtype") or cfg.get("torch_dtype")
        if isinstance(value, str) and value:
            return value.removeprefix("torch.")
    return None


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")   # x86 instructions that do bf16 arithmetic natively


def cpu_bf16_native() -> bool:
    """Whether this CPU computes in bf16 natively (AMX or AVX512-BF16).
    Elsewhere torch emulates bf16 through fp32, slower than fp32 itself, so
    bf16 only pays on these. torch reports the flags (torch.cpu.get_capabilities,
    torch >= 2.8); without it, /proc/cpuinfo does. ARM's bf16 is not counted:
    not measured here."""
    try:
        import torch

        capabilities = torch.cpu.get_capabilities()
        return any(bool(capabilities.get(flag)) for flag in BF16_CPU_FLAGS)
    except (ImportError, AttributeError, RuntimeError):
        pass
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = {f for line in text.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def cpu_auto_dtype(model_dir: str, bf16_native: Callable[[], bool] = cpu_bf16_native) -> str:
    """``--dtype auto`` on a CPU: bfloat16 for a model saved in bfloat16 on a
    CPU with native bf16 (SmolLM2 on the dev box: vLLM 3.4x the samples/s of
    fp32, hf 2.5x, docs/backends.md), float32 for everything else. fp32 weights stay
    fp32: bf16 changed 32 of the bundled model's 100 greedy test episodes,
    and a model trained in fp32 gains nothing it was not trained for."""
    return "bfloat16" if model_dtype(model_dir) == "bfloat16" and bf16_native() else "float32"


def cuda_usable() -> tuple[bool, str]:
    """(torch sees a GPU, why not): torch warns rather than raises when, e.g.,
    the NVIDIA driver is too old, and then silently runs on CPU."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = torch.cuda.is_available()
    reasons = [str(w.message).strip().splitlines()[0] for w in caught if "cuda" in str(w.message).lower()]
    return ok, "; ".join(reasons) or "torch.cuda.is_available() is False"


def check_cpu_allowed(model_dir: str, device: str, allow_cpu: bool, why_no_gpu: str) -> None:
    """Refuse a model over ~1B parameters on CPU unless asked: hours per tree,
    and most often a GPU node whose CUDA setup is broken."""
    if not device.startswith("cpu") or allow_cpu:
        return
    params = parameter_count(model_dir)
    if params is not None and params > CPU_PARAMETER_LIMIT:
        raise UsageError(
            f"refusing to run a {params / 1e9:.1f}B-parameter model on CPU (no usable GPU: {why_no_gpu}); fix the "
            "GPU setup, or pass --allow_cpu 1 (ALLOW_CPU=1) to run on CPU anyway.")


def engine_max_model_len(model_dir: str, explicit: int | None, needed: int | None) -> int | None:
    """The vLLM engine's max_model_len: ``explicit`` (--max_model_len) if it
    fits the model, else what the run needs (prompt budget + max_new_tokens)
    capped at the model's positions (the prompt budget then shrinks to fit,
    Backend.prompt_budget). None lets vLLM take the model's full length."""
    limit = model_position_limit(model_dir)
    if explicit is not None:
        if limit is not None and explicit > limit:
            raise UsageError(f"--max_model_len={explicit} is above the model's {limit} positions "
                             f"(max_position_embeddings in {model_dir}/config.json): lower it to {limit} or less.")
        return explicit
    if needed is not None and limit is not None and needed > limit:
        log.info("vllm max_model_len %d (the model's positions), not %d (prompt budget + max_new_tokens)",
                 limit, needed)
        return limit
    return needed
