"""Model backends behind one interface used by search, revision and eval.

Every stage sends *batches*: a list of conversations, each with n samples. A
backend turns a batch into as few model invocations as it can (one vLLM
`generate` call, one batched hf `generate`, concurrent API requests).

Selection rule (scripts' ``--backend`` flag, else env var ``BACKEND``):
  vllm      offline vllm.LLM, built once per process
  openai    any OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY)
  hf        transformers generate, batched with left padding, CPU or GPU
  python:MODULE:FACTORY   a user-supplied backend; FACTORY(model_dir, seed=...)
            returns a Backend (used by tests and benchmarks for test doubles)
  default   vllm when it is installed and CUDA is available, else hf.

Runtime rules every built-in backend follows (docs/backends.md):
* Greedy (temperature 0) gives ONE sample per request: n is forced to 1,
  logged once. vLLM refuses greedy with n > 1 and hf would return n copies.
* A request whose prompt does not fit the model's context fails alone
  (``PromptTooLong`` in its place in the result list); the batch goes on.
* hf and vllm refuse a model over ~1B parameters on CPU unless allowed
  (``--allow_cpu 1``): no usable GPU usually means a broken CUDA setup.
* ``make_backend`` logs one line: backend, device, dtype, model.

One module per concern:
  base.py            the interface: requests, sampling, stats, errors, Backend
  chat.py            chat template, token counts, stop strings
  rules.py           request seeds, greedy = one sample, too long, duplicates
  model_files.py     MODEL_DIR, the bundled model, positions, size, CPU guard
  vllm_backend.py, hf_backend.py, openai_backend.py   one file per backend
  factory.py         make_backend: the flag to a ready backend
  lazy.py            LazyBackend: the backend made at first use

Every public name is importable from ``agent_r.llm`` itself.
"""
from agent_r.llm.base import (Backend, BackendError, BackendStats, GenerationRequest, PromptTooLong, RequestFailed,
                              SamplingConfig)
from agent_r.llm.chat import chat_messages, chat_prompt, chat_token_count, cut_at_stop, load_tokenizer
from agent_r.llm.factory import BACKEND_KINDS, check_backend, make_backend
from agent_r.llm.hf_backend import CPU_HF_BATCH, HFBackend, gc_paused
from agent_r.llm.lazy import LazyBackend
from agent_r.llm.model_files import (BUNDLED_MODEL, CPU_PARAMETER_LIMIT, check_cpu_allowed, cuda_usable,
                                     engine_max_model_len, format_parameters, model_config, model_position_limit,
                                     parameter_count, resolve_model_dir, weights_sha256)
from agent_r.llm.openai_backend import OpenAIBackend
from agent_r.llm.rules import DuplicateWatch, combined_seed, derive_seed, duplicate_watch, single_if_greedy, too_long
from agent_r.llm.vllm_backend import CPU_KV_CACHE_GIB, VLLMBackend

__all__ = [
    "BACKEND_KINDS", "BUNDLED_MODEL", "Backend", "BackendError", "BackendStats", "CPU_HF_BATCH", "CPU_KV_CACHE_GIB",
    "CPU_PARAMETER_LIMIT", "DuplicateWatch", "GenerationRequest", "HFBackend", "LazyBackend", "OpenAIBackend",
    "PromptTooLong", "RequestFailed", "SamplingConfig", "VLLMBackend", "chat_messages", "chat_prompt",
    "chat_token_count", "check_backend", "check_cpu_allowed", "combined_seed", "cuda_usable", "cut_at_stop", "derive_seed",
    "duplicate_watch", "engine_max_model_len", "format_parameters", "gc_paused", "load_tokenizer", "make_backend",
    "model_config", "model_position_limit", "parameter_count", "resolve_model_dir", "single_if_greedy", "too_long",
    "weights_sha256",
]
