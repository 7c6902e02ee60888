"""bf16 vs fp32 on a CPU for a model saved in bf16 (SmolLM2-135M-Instruct,
`make smollm2`): what ``--dtype auto`` gains and what it changes, through the
backends the scripts use (make_backend).

One backend x dtype per command; each appends one JSON row to --out (speed,
and the greedy replies), and --table prints the rows as a markdown table with
each row's greedy agreement against the float32 row of the same backend:

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_cpu_dtype --backend hf --dtype bfloat16 --out runs/cpu_dtype.jsonl
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.bench_cpu_dtype --backend hf --dtype float32 --out runs/cpu_dtype.jsonl
    .venv-vllm/bin/python -m bench.bench_cpu_dtype --backend vllm --dtype bfloat16 --out runs/cpu_dtype.jsonl
    .venv-vllm/bin/python -m bench.bench_cpu_dtype --backend vllm --dtype float32 --out runs/cpu_dtype.jsonl
    .venv/bin/python -m bench.bench_cpu_dtype --table runs/cpu_dtype.jsonl
    # the CPU trainer's step (forward, backward, AdamW) on one 1,024-token sample, fp32 vs bf16 autocast:
    OMP_NUM_THREADS=2 .venv/bin/python -m bench.bench_cpu_dtype --train_steps 3 --out runs/cpu_dtype.jsonl

Prompts: the first turn of TextCraft tasks (the bundled instruction and the
task's crafting commands and goal, agent_r.conversation's layout). Speed:
one batch of all prompts x n samples at temperature 1 (seeded), after a
one-prompt warm-up; tokens are the completions re-tokenized. Greedy: the
same prompts at temperature 0; "identical" counts equal replies, "tokens
agreeing" the reply tokens before the first difference over all tokens of
the float32 replies.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from agent_r.llm.gguf_wheel import SMOLLM2_DIR


def prompts(count: int, first: int) -> list[list[dict]]:
    from agent_r.conversation import initial_conversation
    from agentenv_client.base import load_instruction
    from agentenv_servers.textcraft_env import TextCraftGame, load_recipe_book

    instruction, book = load_instruction("textcraft"), load_recipe_book()
    return [initial_conversation(instruction, TextCraftGame(i, book=book).observation)
            for i in range(first, first + count)]


def measure(args: argparse.Namespace) -> dict:
    from agent_r.knobs import BackendSettings
    from agent_r.llm import GenerationRequest, SamplingConfig, make_backend

    convs = prompts(args.prompts, args.first_task)
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    backend = make_backend(BackendSettings(backend=args.backend, model_dir=args.model_dir, dtype=args.dtype),
                           seed=0, max_model_len=2048)
    start_s = time.perf_counter() - started
    info = backend.describe()
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    backend.generate([GenerationRequest(convs[0], n=1, seed=0)], sampled)        # warm-up
    t = time.perf_counter()
    out = backend.generate([GenerationRequest(c, n=args.n, seed=i) for i, c in enumerate(convs)], sampled)
    sampled_s = time.perf_counter() - t
    count = lambda text: len(backend.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    samples = sum(len(o) for o in out)
    tokens = sum(count(x) for o in out for x in o)
    t = time.perf_counter()
    greedy = backend.generate([GenerationRequest(c) for c in convs],
                              SamplingConfig(temperature=0.0, max_new_tokens=args.greedy_tokens))
    greedy_s = time.perf_counter() - t
    replies = [o[0] for o in greedy]
    return {"backend": args.backend, "dtype": info["dtype"], "asked": args.dtype, "model": Path(args.model_dir).name,
            "device": info["device"], "threads": os.environ.get("OMP_NUM_THREADS", "default"),
            "load": [round(load_start, 2), round(os.getloadavg()[0], 2)], "start_s": round(start_s, 1),
            "prompts": len(convs), "prompt_tokens": round(sum(backend.count_tokens(c) for c in convs) / len(convs)),
            "n": args.n, "samples": samples, "tokens": tokens, "sampled_s": round(sampled_s, 2),
            "samples_per_s": round(samples / sampled_s, 2), "tokens_per_s": round(tokens / sampled_s, 1),
            "greedy_s": round(greedy_s, 2), "greedy_tokens": sum(count(r) for r in replies), "replies": replies}


def train_steps(args: argparse.Namespace) -> list[dict]:
    """Seconds per optimizer step of agent_r.training.cpu.fit on one
    1,024-token sample (every token trained), fp32 and bf16 autocast
    alternating in one process (the same load for both), after a warm-up."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r.llm.chat import chat_prompt
    from agent_r.training import cpu
    from agent_r.training.settings import TrainKnobs

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    ids: list[int] = []
    for conv in prompts(8, args.first_task):
        ids += tokenizer(chat_prompt(tokenizer, conv), add_special_tokens=False)["input_ids"]
    example = cpu.Example(ids[:1024], ids[:1024], "bench")
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    knobs = TrainKnobs(max_length=1024, lr=1e-6, warmup_ratio=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    load_start = os.getloadavg()[0]
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for autocast in (False, True):   # warm-up
        cpu.fit(model, [[[example]]], knobs, pad, bf16_autocast=autocast)
    for _ in range(args.train_steps):
        for autocast in (False, True):
            t = time.perf_counter()
            cpu.fit(model, [[[example]]], knobs, pad, bf16_autocast=autocast)
            seconds[autocast].append(round(time.perf_counter() - t, 2))
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    return [{"backend": "cpu trainer", "dtype": "bf16 autocast" if autocast else "float32", "model":
             Path(args.model_dir).name, "threads": os.environ.get("OMP_NUM_THREADS", "default"), "load": load,
             "tokens": len(example.ids), "step_s": steps,
             "mean_step_s": round(sum(steps) / len(steps), 2)} for autocast, steps in seconds.items()]


def agreement(rows: list[dict], row: dict, tokenizer: Any) -> tuple[str, str]:
    """Greedy agreement of ``row`` with the float32 row of its backend."""
    ref = next((r for r in rows if r["backend"] == row["backend"] and r["dtype"] == "float32"), None)
    if ref is None or ref is row:
        return "-", "-"
    same = sum(a == b for a, b in zip(row["replies"], ref["replies"]))
    agree = total = 0
    for a, b in zip(row["replies"], ref["replies"]):
        x, y = tokenizer.encode(a, add_special_tokens=False), tokenizer.encode(b, add_special_tokens=False)
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        agree, total = agree + k, total + len(y)
    return f"{same}/{len(ref['replies'])}", f"{100 * agree / max(total, 1):.1f}%"


def table(path: str, model_dir: str) -> str:
    from transformers import AutoTokenizer

    every = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    rows = [r for r in every if "replies" in r]
    trainer = [r for r in every if "step_s" in r]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    head = ("| backend | dtype | threads | load (1 min, start/end) | prompts x n | prompt tokens | engine start s | "
            "samples/s | tokens/s | greedy s | greedy identical to fp32 | greedy tokens agreeing |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        same, tokens = agreement(rows, r, tokenizer)
        lines.append(f"| {r['backend']} | {r['dtype']} | {r['threads']} | {r['load'][0]} / {r['load'][1]} | "
                     f"{r['prompts']} x {r['n']} | {r['prompt_tokens']} | {r['start_s']} | {r['samples_per_s']} | "
                     f"{r['tokens_per_s']} | {r['greedy_s']} | {same} | {tokens} |")
    if trainer:
        lines += ["", "| trainer step | threads | load (1 min, start/end) | tokens | s per step | mean s |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['dtype']} | {r['threads']} | {r['load'][0]} / {r['load'][1]} | {r['tokens']} | "
                  f"{', '.join(map(str, r['step_s']))} | {r['mean_step_s']} |" for r in trainer]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    p.add_argument("--model_dir", default=str(SMOLLM2_DIR))
    p.add_argument("--prompts", type=int, default=32, help="TextCraft tasks, one first-turn prompt each (default 32)")
    p.add_argument("--first_task", type=int, default=0)
    p.add_argument("--n", type=int, default=4, help="samples per prompt in the speed batch (default 4)")
    p.add_argument("--max_new_tokens", type=int, default=40, help="speed batch (default 40)")
    p.add_argument("--greedy_tokens", type=int, default=60, help="greedy replies (default 60)")
    p.add_argument("--train_steps", type=int, default=0, help="instead: time this many CPU-trainer steps per "
                   "precision (fp32, bf16 autocast)")
    p.add_argument("--out", help="append the row to this JSONL")
    p.add_argument("--table", help="print the rows of this JSONL as a markdown table")
    args = p.parse_args()
    if args.table:
        print(table(args.table, args.model_dir))
        return
    rows = train_steps(args) if args.train_steps else [measure(args)]
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "replies"}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
