"""A local OpenAI-compatible chat-completions server for tests and demos.

Serves a model through ``HFBackend`` (or a JSON policy table through the
scripted test double), so the real ``openai`` client and ``OpenAIBackend`` can
be exercised without a network. Fault injection makes it a test double for an
unreliable endpoint: on a seeded random fraction of requests it answers 429 or
500, or hangs until the client times out.

    python -m tests.support.openai_server --port 8000 --model-dir DIR \
        [--policy-json TABLE.json] [--fail-rate 0.2 --fail-seed 0 --fail-kinds 429,500,timeout] \
        [--max-choices K] [--api-key KEY]

``--max-choices K`` returns at most K choices per request (some servers cap
n), ``--api-key`` requires ``Authorization: Bearer KEY`` (401 otherwise).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agent_r.llm import Backend, GenerationRequest, SamplingConfig, chat_token_count

FAULT_KINDS = ("429", "500", "timeout")


def build_app(backend: Backend, model_name: str, fail_rate: float = 0.0, fail_seed: int = 0,
              fail_kinds: tuple[str, ...] = FAULT_KINDS, max_choices: int | None = None,
              api_key: str | None = None, hang_seconds: float = 600.0) -> FastAPI:
    app = FastAPI()
    rng = random.Random(fail_seed)
    model_lock = threading.Lock()  # one generate at a time: the model is not shared safely across threads
    counts = {"requests": 0, "faults": 0}

    def error(status: int, message: str, kind: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    def count(messages: list[dict], texts: list[str]) -> tuple[int, int]:
        tok = getattr(backend, "tokenizer", None)
        if tok is None:
            return backend.count_tokens(messages), sum(len(t.split()) for t in texts)
        return chat_token_count(tok, messages), sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True, **counts}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "local"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return error(401, "invalid api key", "authentication_error")
        counts["requests"] += 1
        if fail_rate > 0 and rng.random() < fail_rate:
            counts["faults"] += 1
            kind = rng.choice(fail_kinds)
            if kind == "429":
                return error(429, "rate limited (injected fault)", "rate_limit_error")
            if kind == "500":
                return error(500, "internal error (injected fault)", "server_error")
            await asyncio.sleep(hang_seconds)
            return error(504, "hung (injected fault)", "timeout")
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error(400, "messages must be a non-empty list", "invalid_request_error")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        n = int(body.get("n") or 1)
        if max_choices is not None:
            n = min(n, max_choices)
        sampling = SamplingConfig(temperature=float(body.get("temperature", 1.0)), max_new_tokens=int(max_tokens),
                                  stop=stop, top_p=float(body.get("top_p") or 1.0))
        req = GenerationRequest(messages=messages, n=n, seed=body.get("seed"))

        def run() -> tuple[list[str], tuple[int, int]]:
            with model_lock:
                texts = backend.generate([req], sampling)[0]
                return texts, count(messages, texts)

        texts, (prompt_tokens, completion_tokens) = await asyncio.to_thread(run)
        per_text = completion_tokens / max(1, len(texts))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", model_name),
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None,
                 "finish_reason": "length" if per_text >= sampling.max_new_tokens else "stop"}
                for i, t in enumerate(texts)
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model-dir", help="HF model directory served through HFBackend")
    p.add_argument("--policy-json", help="serve a scripted policy table (tests.support.doubles) instead of a model")
    p.add_argument("--model-name", default=None, help="name reported by /v1/models (default: model dir)")
    p.add_argument("--fail-rate", type=float, default=0.0, help="fraction of requests that fail (1.0 = all)")
    p.add_argument("--fail-seed", type=int, default=0)
    p.add_argument("--fail-kinds", default=",".join(FAULT_KINDS), help="comma list of 429,500,timeout")
    p.add_argument("--hang-seconds", type=float, default=600.0, help="how long a 'timeout' fault hangs")
    p.add_argument("--max-choices", type=int, default=None)
    p.add_argument("--api-key", default=None)
    args = p.parse_args()
    kinds = tuple(k.strip() for k in args.fail_kinds.split(",") if k.strip())
    if not kinds or any(k not in FAULT_KINDS for k in kinds):
        p.error(f"--fail-kinds must be a comma list of {','.join(FAULT_KINDS)}")
    if args.policy_json:
        from tests.support.doubles import table_backend

        backend: Backend = table_backend(args.policy_json)
    elif args.model_dir:
        from agent_r.llm import HFBackend

        backend = HFBackend(args.model_dir)
    else:
        p.error("give --model-dir or --policy-json")
    app = build_app(backend, args.model_name or args.model_dir or "scripted", args.fail_rate, args.fail_seed,
                    kinds, args.max_choices, args.api_key, args.hang_seconds)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
