"""Model backends behind one interface used by search, revision and eval.

Every stage sends *batches*: a list of conversations, each with n samples. A
backend turns a batch into as few model invocations as it can (one vLLM
`chat` call, one batched `generate`, concurrent API requests).

Selection rule (scripts' ``--backend`` flag, else env var ``BACKEND``):
  vllm      offline vllm.LLM, built once per process
  openai    any OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY)
  hf        transformers generate, batched with left padding, CPU or GPU
  python:MODULE:FACTORY   a user-supplied backend; FACTORY(model_dir, seed=...)
            returns a Backend (used by tests and benchmarks for test doubles)
  default   vllm when it is installed and CUDA is available, else hf.
"""
from __future__ import annotations

import abc
import concurrent.futures
import hashlib
import importlib
import importlib.util
import logging
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

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
    samples reproducible independently of what else is in the batch, on
    backends that support per-request seeds (vllm, scripted doubles)."""

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


class Backend(abc.ABC):
    """Generate for a batch; count a conversation's chat-prompt tokens."""

    name: str = "backend"

    def __init__(self) -> None:
        self.stats = BackendStats()

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        """Return, for each request, its ``n`` completions (assistant text only)."""

    @abc.abstractmethod
    def count_tokens(self, messages: list[dict]) -> int:
        """Tokens of the real chat prompt for ``messages`` (with the generation prompt)."""

    def close(self) -> None:
        """Release model memory / connections."""

    def describe(self) -> dict[str, Any]:
        """What goes into run manifests (never secrets)."""
        return {"backend": self.name}


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
    # The template already contains bos; adding special tokens again would double it.
    return len(tokenizer(chat_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"])


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


# ----------------------------------------------------------------------------- vllm

_VLLM_ENGINES: dict[tuple, Any] = {}

class VLLMBackend(Backend):
    """Offline vllm.LLM, built once per process; one ``llm.chat`` call per
    generate() with a per-request SamplingParams (so each request keeps its own
    seed and n). Prefix caching is on: the n samples and the siblings of a tree
    node share their whole conversation prefix."""

    name = "vllm"

    def __init__(self, model_dir: str, dtype: str = "auto", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, seed: int = 0) -> None:
        super().__init__()
        try:
            import vllm
        except ImportError:
            raise BackendError(
                "backend vllm needs the vllm package (CUDA): `pip install vllm`, "
                "or choose --backend hf (transformers) or --backend openai (a served endpoint)."
            ) from None
        self._vllm = vllm
        self.model_dir = model_dir
        self.options = dict(dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, seed=seed)
        key = (model_dir, tuple(sorted(self.options.items())))
        if key not in _VLLM_ENGINES:  # an engine takes minutes and most of the GPU: one per process
            _VLLM_ENGINES[key] = vllm.LLM(model=model_dir, enable_prefix_caching=True, **self.options)
        self._key = key
        self.llm = _VLLM_ENGINES[key]
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        requests = list(requests)
        if not requests:
            return []
        params = [
            self._vllm.SamplingParams(
                n=r.n, temperature=sampling.temperature, top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens, stop=list(sampling.stop) or None, seed=r.seed,
            )
            for r in requests
        ]
        outputs = self.llm.chat([chat_messages(r.messages) for r in requests], params, use_tqdm=False)
        result = [[cut_at_stop(o.text, sampling.stop) for o in out.outputs] for out in outputs]
        self.stats.calls += 1
        self.stats.requests += len(requests)
        self.stats.samples += sum(len(r) for r in result)
        return result

    def count_tokens(self, messages: list[dict]) -> int:
        return chat_token_count(self.tokenizer, messages)

    def close(self) -> None:
        _VLLM_ENGINES.pop(self._key, None)
        del self.llm

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model_dir": self.model_dir, "vllm": self._vllm.__version__, **self.options}


# ----------------------------------------------------------------------------- transformers

class HFBackend(Backend):
    """transformers ``generate`` with left padding, batched over all requests x n.

    Greedy (temperature 0) is exact and independent of batch composition.
    Sampling is reproducible per *batch*, not per request: when every request
    carries a seed, torch is seeded from the combination of all seeds, so the
    same batch gives the same samples, but a request's samples change when its
    batch-mates change (use vllm for per-request seeds). ``seed`` seeds torch
    once at construction, so a whole run with unseeded requests repeats too.
    """

    name = "hf"

    def __init__(self, model_dir: str, device: str = "auto", dtype: str = "auto", batch_size: int = 16,
                 seed: int | None = None) -> None:
        super().__init__()
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        if seed is not None:
            torch.manual_seed(seed)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        self.model_dir, self.device, self.dtype, self.batch_size = model_dir, device, dtype, max(1, batch_size)
        self.tokenizer = load_tokenizer(model_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = eos

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        requests = list(requests)
        prompts = [chat_prompt(self.tokenizer, r.messages) for r in requests]
        flat = [(i, prompts[i]) for i, r in enumerate(requests) for _ in range(r.n)]
        seeds = [r.seed for r in requests]
        if requests and sampling.temperature > 0 and all(s is not None for s in seeds):
            self._torch.manual_seed(_combined_seed(seeds))
        result: list[list[str]] = [[] for _ in requests]
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start:start + self.batch_size]
            for (i, _), text in zip(chunk, self._generate_texts([p for _, p in chunk], sampling)):
                result[i].append(cut_at_stop(text, sampling.stop))
        self.stats.calls += 1
        self.stats.requests += len(requests)
        self.stats.samples += len(flat)
        return result

    def _generate_texts(self, prompts: list[str], sampling: SamplingConfig) -> list[str]:
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        kwargs: dict[str, Any] = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=self.eos_ids,
                                      pad_token_id=self.tokenizer.pad_token_id)
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.stop:  # stop early; the text is cut at the stop string afterwards
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        with self._torch.no_grad():
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
        return {"backend": self.name, "model_dir": self.model_dir, "device": self.device, "dtype": self.dtype,
                "batch_size": self.batch_size}


# ----------------------------------------------------------------------------- openai

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
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="openai")
        self._lock = threading.Lock()
        self._abort = threading.Event()   # set while a failed batch winds down

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        requests = list(requests)
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
            self.stats.samples += sum(len(r) for r in result)
        return result

    def _complete(self, request: GenerationRequest, sampling: SamplingConfig) -> list[str]:
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
            choices = self._call(args).choices
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
                    raise BackendError(self._redact(
                        f"OpenAI endpoint {self.endpoint} rejected the request: {reason}: {exc}. "
                        "Check OPENAI_API_KEY, MODEL_NAME and OPENAI_BASE_URL.")) from None
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


# ----------------------------------------------------------------------------- selection

def make_backend(settings: BackendSettings, seed: int = 0, max_model_len: int | None = None) -> Backend:
    """The backend ``settings.backend`` names (module docstring). MODEL_DIR
    unset means the bundled model. ``max_model_len`` is the engine context the
    caller needs (its prompt budget + max_new_tokens), used by vllm when
    ``settings.max_model_len`` is not set."""
    kind = (settings.backend or "").strip() or ("vllm" if _vllm_usable() else "hf")
    if kind.startswith("python:"):
        return _user_backend(kind, settings, seed)
    if kind == "vllm":
        return VLLMBackend(resolve_model_dir(settings.model_dir), dtype=settings.dtype,
                           tensor_parallel_size=settings.tensor_parallel_size,
                           gpu_memory_utilization=settings.gpu_memory_utilization,
                           max_model_len=settings.max_model_len or max_model_len, seed=seed)
    if kind == "hf":
        return HFBackend(resolve_model_dir(settings.model_dir), dtype=settings.dtype,
                         batch_size=settings.hf_batch_size, seed=seed)
    if kind == "openai":
        return _openai_backend(settings)
    raise UsageError(f"unknown backend {kind!r}: choose one of {', '.join(BACKEND_KINDS)} (flag --backend or env BACKEND).")


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
