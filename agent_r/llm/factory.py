"""Which backend a run gets: the scripts' ``--backend`` flag (env BACKEND)
turned into a ready Backend, announced in one log line."""
from __future__ import annotations

import importlib
import importlib.util
import logging
from pathlib import Path

from agent_r.knobs import BackendSettings
from agent_r.llm.base import Backend
from agent_r.llm.hf_backend import HFBackend
from agent_r.llm.model_files import engine_max_model_len, resolve_model_dir
from agent_r.llm.openai_backend import OpenAIBackend
from agent_r.llm.vllm_backend import VLLMBackend
from agent_r.settings import UsageError

log = logging.getLogger(__name__)

BACKEND_KINDS = ("vllm", "openai", "hf", "python:MODULE:FACTORY")


def make_backend(settings: BackendSettings, seed: int = 0, max_model_len: int | None = None) -> Backend:
    """The backend ``settings.backend`` names (package docstring), announced
    in one log line (backend, device, dtype, model). MODEL_DIR unset means the
    bundled model. ``max_model_len`` is the context the caller needs (its
    prompt budget + max_new_tokens): vllm sizes its engine by it (capped at
    the model's positions) unless ``settings.max_model_len`` is set."""
    kind = (settings.backend or "").strip() or ("vllm" if _vllm_usable() else "hf")
    if kind.startswith("python:"):
        backend = _user_backend(kind, settings, seed)
    elif kind == "vllm":
        model_dir = resolve_model_dir(settings.model_dir)
        backend = VLLMBackend(model_dir, dtype=settings.dtype, tensor_parallel_size=settings.tensor_parallel_size,
                              gpu_memory_utilization=settings.gpu_memory_utilization,
                              max_model_len=engine_max_model_len(model_dir, settings.max_model_len, max_model_len),
                              seed=seed, allow_cpu=settings.allow_cpu, kv_cache_gib=settings.kv_cache_gib)
    elif kind == "hf":
        backend = HFBackend(resolve_model_dir(settings.model_dir), dtype=settings.dtype,
                            batch_size=settings.hf_batch_size, seed=seed, allow_cpu=settings.allow_cpu,
                            cache_gib=settings.hf_cache_gib)
    elif kind == "openai":
        backend = _openai_backend(settings)
    else:
        raise UsageError(f"unknown backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)} (flag --backend or "
                         "env BACKEND).")
    log.info("model: %s", backend.startup_line())
    return backend


def check_backend(settings: BackendSettings) -> None:
    """UsageError, before a run writes anything, where the model cannot load:
    a MODEL_DIR that does not exist, or the vllm backend in a Python without
    vllm (otherwise the error comes at the first model turn, after the run
    made its output folder)."""
    kind = (settings.backend or "").strip() or ("vllm" if _vllm_usable() else "hf")
    if kind in ("vllm", "hf"):
        resolve_model_dir(settings.model_dir)
    if kind == "vllm" and not _vllm_usable():
        raise UsageError("--backend vllm needs the vllm package, which this Python lacks: `make setup-gpu` on a GPU "
                         "node, `make setup-vllm` for its CPU build (run with .venv-vllm/bin/python), or --backend hf")


def _openai_backend(settings: BackendSettings) -> Backend:
    model = settings.model_name or settings.model_dir
    if not model:
        raise UsageError("backend openai needs a model name: set MODEL_NAME (or MODEL_DIR) to the served model.")
    model_dir = settings.model_dir
    tokenizer = model_dir if model_dir and (Path(model_dir) / "tokenizer_config.json").exists() else None
    azure = None
    if settings.azure_endpoint:
        azure = (settings.azure_endpoint, settings.azure_api_key, settings.azure_api_version)
    return OpenAIBackend(model, settings.openai_base_url, settings.openai_api_key or "EMPTY", tokenizer=tokenizer,
                         timeout=settings.openai_timeout, max_retries=settings.openai_max_retries, azure=azure,
                         max_concurrency=settings.openai_concurrency)


def _vllm_usable() -> bool:
    """The default backend is vllm wherever it is installed: its GPU build on
    a GPU node, its CPU build (``make setup-vllm``) on a laptop, where its
    prefix cache makes tree search ~10x faster than hf (docs/backends.md)."""
    return importlib.util.find_spec("vllm") is not None


def _user_backend(kind: str, settings: BackendSettings, seed: int) -> Backend:
    """``python:MODULE:FACTORY``: FACTORY(model_dir, seed=...) must return a
    Backend (test doubles, benchmarks, a user's own model server)."""
    parts = kind.split(":")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise UsageError(f"backend {kind!r} must look like python:MODULE:FACTORY, e.g. python:mypkg.backends:make")
    _, module_name, factory_name = parts
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"backend {kind!r}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UsageError(f"backend {kind!r}: module {module_name!r} has no callable {factory_name!r}")
    backend = factory(settings.model_dir, seed=seed)
    if not isinstance(backend, Backend):
        raise UsageError(f"backend {kind!r}: {factory_name} returned {type(backend).__name__}, not an agent_r.llm.Backend")
    return backend
