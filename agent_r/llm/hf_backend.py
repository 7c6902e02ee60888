"""transformers ``generate`` as a backend (``--backend hf``): batched with
left padding, on a GPU or the CPU."""
from __future__ import annotations

import contextlib
import functools
import gc
import logging
from typing import Any, Callable, Iterator, Sequence

from agent_r.llm.base import Backend, GenerationRequest, RequestFailed, SamplingConfig
from agent_r.llm.chat import chat_prompt, chat_token_count, cut_at_stop, load_tokenizer
from agent_r.llm.model_files import (check_cpu_allowed, cpu_auto_dtype, cpu_bf16_native, cuda_usable, format_parameters,
                                    model_position_limit)
from agent_r.llm.prefix_cache import PrefixCache
from agent_r.llm.rules import combined_seed, single_if_greedy, too_long

log = logging.getLogger(__name__)

CPU_HF_BATCH = 16   # hf on CPU: sequences per generate call when --hf_batch_size is 0 (auto)
DEFAULT_CACHE_GIB = 4.0   # keys/values kept between calls (--hf_cache_gib)


@functools.cache
def cache_argument() -> str:
    """generate's name for a cache to start from: ``cache`` from transformers
    5.2x on (``past_key_values`` is deprecated there), before that ``past_key_values``."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
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
                 seed: int | None = None, allow_cpu: bool = False,
                 cpu_bf16: Callable[[], bool] = cpu_bf16_native, cache_gib: float = DEFAULT_CACHE_GIB) -> None:
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
            dtype = "bfloat16" if device.startswith("cuda") else cpu_auto_dtype(model_dir, cpu_bf16)
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
        self.prefix_cache = PrefixCache(int(cache_gib * 2**30)) if cache_gib > 0 else None
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
            self._torch.manual_seed(combined_seed(seeds))
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
        width = batch["input_ids"].shape[1]
        rows = []
        if self.prefix_cache is not None:
            rows = [ids[mask.bool()].cpu().numpy() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
            cache, _ = self.prefix_cache.batch_cache(rows, width, batch["input_ids"])
            kwargs.update({"return_dict_in_generate": True, cache_argument(): cache})
        with self._torch.no_grad(), gc_paused():
            out = self.model.generate(**batch, **kwargs)
        if self.prefix_cache is not None:
            final = getattr(out, cache_argument())
            stops = set(self.eos_ids) | {self.tokenizer.pad_token_id}
            if not self.prefix_cache.keep(rows, out.sequences[:, width:], width, final, stops):
                log.info("hf: this model's cache (%s) is not a plain full-attention one; turns are computed "
                         "whole (no key/value reuse between calls)", type(final).__name__)
                self.prefix_cache = None
            out = out.sequences
        new = out[:, width:]
        return self.tokenizer.batch_decode(new, skip_special_tokens=True)

    def count_tokens(self, messages: list[dict]) -> int:
        return chat_token_count(self.tokenizer, messages)

    def close(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        del self.model
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "device": self.device, "dtype": self.dtype, "model_dir": self.model_dir,
                "parameters": format_parameters(self.model_dir), "batch_size": self.batch_size,
                "context_limit": self.context_limit,
                "cache_gib": self.prefix_cache.budget_bytes / 2**30 if self.prefix_cache else 0}
