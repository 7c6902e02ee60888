"""HFBackend throughput: one request per generate() call vs 16 per call.

Builds tiny random Llamas (as the tests do) and samples the same 16
conversations both ways; prints generated tokens per second. Tokens are the
completions re-tokenized, so early-eos samples count only what they produced.

    .venv/bin/python -m bench.bench_llm [--max-new-tokens 64] [--hidden 64,256] [--threads 1]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


import torch  # noqa: E402

from agent_r.settings import run_cli  # noqa: E402
from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig  # noqa: E402
from tests.support.model_fixtures import build_tiny_model  # noqa: E402

N_CONVERSATIONS = 16


def conversations() -> list[list[dict]]:
    return [[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Reply with Thought: ... Action: ..."},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: craft item {i}."},
    ] for i in range(N_CONVERSATIONS)]


def run(backend: HFBackend, batch: int, sampling: SamplingConfig) -> tuple[float, int]:
    convs = conversations()
    backend.generate([GenerationRequest(convs[0])], sampling)  # warm-up
    start = time.perf_counter()
    texts: list[str] = []
    for i in range(0, len(convs), batch):
        for out in backend.generate([GenerationRequest(c, seed=j) for j, c in enumerate(convs[i:i + batch])], sampling):
            texts += out
    seconds = time.perf_counter() - start
    tokens = sum(len(backend.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return seconds, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--hidden", default="64,256", help="comma list of hidden sizes (multiples of 64)")
    p.add_argument("--threads", default="1", help="comma list of torch CPU thread counts")
    args = p.parse_args()
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in [int(h) for h in args.hidden.split(",")]:
            backend = HFBackend(build_tiny_model(Path(tmp) / f"h{hidden}", hidden=hidden), device="cpu", batch_size=16)
            for threads in [int(t) for t in args.threads.split(",")]:
                torch.set_num_threads(threads)
                for batch in (1, 16):
                    seconds, tokens = run(backend, batch, sampling)
                    rows.append((hidden, threads, batch, seconds, tokens))
    print(f"HFBackend, {N_CONVERSATIONS} conversations x 1 sample, max_new_tokens={args.max_new_tokens}, CPU")
    print(f"{'hidden':>6} {'threads':>7} {'batch':>5} {'seconds':>8} {'tokens':>7} {'tokens/s':>9} {'vs batch 1':>10}")
    base = {}
    for hidden, threads, batch, seconds, tokens in rows:
        rate = tokens / seconds
        base.setdefault((hidden, threads), rate)
        print(f"{hidden:>6} {threads:>7} {batch:>5} {seconds:>8.2f} {tokens:>7} {rate:>9.0f} "
              f"{rate / base[hidden, threads]:>9.1f}x")


if __name__ == "__main__":
    run_cli(main)
