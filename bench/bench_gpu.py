"""GPU checks of the project's GPU paths (hf backend, scripts, XTuner), with
random-weight Llama models built locally from a config (no hub).

Phases, each a subcommand that adds its results to one JSON file (--results):

  info        nvidia-smi, torch / transformers versions
  build       a random Llama in bf16: --shape 8b (Llama-3.1-8B), 1b (Llama-3.2-1B)
              or tiny (CPU tests); the bundled model's tokenizer (vocab = its length)
  throughput  pure batched generation (HFBackend.generate, every sample forced to
              max_new_tokens) vs generated tokens/s during a real mcts_collection
              run (in-process, same backend object) at the same batch; --record_dir
              keeps the search's generate calls (JSONL)
  trainer_rate  the in-process trainer (TRAIN_DEVICE=cuda) on a run's export: tokens/s and
              losses per batching variant, one step profiled
  replay      those calls in a fresh process, once per variant (as recorded, prefix
              cache off, sorted by length, no stop strings, greedy); --profile_call K
              traces one call with torch.profiler (host syncs, top ops, GC runs)
  pipeline    mcts_collection, path_collection (centric --revise 1, good), export,
              eval as subprocesses with --backend hf; exit codes, wall, tracebacks
  train       xtuner_config/train.sh (XTuner + DeepSpeed ZeRO-2) on the export,
              then the converted model reloaded with the hf backend

bench/gpu_check.sh drives them (on the GPU box and, with tiny settings, on CPU).
Results: bench/RESULTS.md ("GPU checks").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "models" / "textcraft-tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

SHAPES = {
    # Llama-3.1-8B / Llama-3.2-1B shapes; vocab is the bundled tokenizer's.
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, rope_theta=500000.0, tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, rope_theta=500000.0, tie_word_embeddings=True),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=256, rope_theta=500000.0, tie_word_embeddings=True),
}


# ----------------------------------------------------------------------------- results

def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save_results(path: Path, key: str, value) -> None:
    data = load_results(path)
    data[key] = value
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
    print(f"[bench_gpu] {key}: {json.dumps(value, default=str)[:3000]}", flush=True)


def time_left(args) -> float:
    return (args.deadline - time.time()) if args.deadline else float("inf")


def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- info

def cmd_info(args) -> None:
    import torch
    import transformers

    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    info = {
        "python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "nvidia_smi": smi.stdout if smi else "nvidia-smi not found",
    }
    print(info["nvidia_smi"], flush=True)
    save_results(args.results, "info", info)


# ----------------------------------------------------------------------------- build

def _legacy_config_keys(config_path: Path, dtype: str) -> None:
    """transformers 4.48 (XTuner) reads rope_theta / torch_dtype; 5.x writes
    rope_parameters / dtype. Write both (as tests/support/model_fixtures does)."""
    cfg = json.loads(config_path.read_text())
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", cfg.get("dtype", dtype))
    config_path.write_text(json.dumps(cfg, indent=2))


def cmd_build(args) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(args.out)
    tok = AutoTokenizer.from_pretrained(str(BUNDLED))
    bundled_cfg = json.loads((BUNDLED / "config.json").read_text())
    shape = SHAPES[args.shape]
    config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=8192, rms_norm_eps=1e-5,
                         bos_token_id=bundled_cfg["bos_token_id"], eos_token_id=bundled_cfg["eos_token_id"],
                         pad_token_id=bundled_cfg["pad_token_id"], **shape)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    model = model.to(dtype)
    cuda_sync()
    t_init = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    model.save_pretrained(str(out))
    t_save = time.perf_counter() - t0
    # The bundled tokenizer files verbatim: they are in the transformers 4.x form
    # that XTuner's transformers 4.48 reads (files saved by 5.x are not).
    for name in TOKENIZER_FILES:
        shutil.copy(BUNDLED / name, out / name)
    shutil.copy(BUNDLED / "generation_config.json", out / "generation_config.json")
    _legacy_config_keys(out / "config.json", args.dtype)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    size = sum(f.stat().st_size for f in out.iterdir())
    save_results(args.results, f"build_{args.shape}", {
        "dir": str(out), "shape": args.shape, **shape, "vocab_size": len(tok),
        "vocab_note": "bundled textcraft-tiny tokenizer (Llama-3.1 has 128,256): the LM head is tiny",
        "params": n_params, "dtype": args.dtype, "init_device": device, "init_s": round(t_init, 2),
        "save_s": round(t_save, 2), "bytes": size})


# ----------------------------------------------------------------------------- throughput

class Meter:
    """Wraps model.generate: counts generated tokens (up to and including the
    first eos, pads excluded), rows, decode steps, GPU-synchronised seconds."""

    def __init__(self, backend) -> None:
        import torch

        self.torch = torch
        self.backend = backend
        self.orig = backend.model.generate
        self.eos = torch.tensor(sorted(set(backend.eos_ids)), device=backend.device)
        self.pad = backend.tokenizer.pad_token_id
        self.reset()
        backend.model.generate = self._generate

    def reset(self) -> None:
        self.tokens = self.rows = self.calls = self.steps = 0
        self.seconds = 0.0
        self.chunk_rows: list[int] = []
        self.prompt_lens: list[int] = []
        self.per_call: list[list] = []   # [padded prompt len, rows, decode steps, seconds, ms per step]

    def _generate(self, *a, **kw):
        torch = self.torch
        cuda_sync()
        t0 = time.perf_counter()
        out = self.orig(*a, **kw)
        cuda_sync()
        dt = time.perf_counter() - t0
        self.seconds += dt
        inp = kw["input_ids"]
        sequences = getattr(out, "sequences", out)   # a dict-like output when the backend keeps caches
        new = sequences[:, inp.shape[1]:]
        is_eos = torch.isin(new, self.eos)
        after_first_eos = (torch.cumsum(is_eos.int(), dim=1) - is_eos.int()) > 0
        valid = ~after_first_eos & ~((new == self.pad) & ~is_eos)
        self.tokens += int(valid.sum())
        self.rows += new.shape[0]
        self.steps += new.shape[1]
        self.calls += 1
        self.chunk_rows.append(new.shape[0])
        self.prompt_lens.append(inp.shape[1])
        self.per_call.append([inp.shape[1], new.shape[0], new.shape[1], round(dt, 3),
                              round(1000 * dt / max(1, new.shape[1]), 1)])
        return out

    def snapshot(self, wall: float | None = None) -> dict:
        d = {"generated_tokens": self.tokens, "generate_calls": self.calls, "rows": self.rows,
             "decode_steps": self.steps, "generate_s": round(self.seconds, 3),
             "tokens_per_s_in_generate": round(self.tokens / self.seconds, 1) if self.seconds else None,
             "chunk_rows": _summary(self.chunk_rows), "padded_prompt_len": _summary(self.prompt_lens),
             "ms_per_decode_step": round(1000 * self.seconds / self.steps, 2) if self.steps else None,
             "per_call": self.per_call[:40]}
        if wall is not None:
            d["wall_s"] = round(wall, 3)
            d["tokens_per_s"] = round(self.tokens / wall, 1) if wall else None
            d["generate_fraction_of_wall"] = round(self.seconds / wall, 3) if wall else None
        return d


def _summary(xs: list[int]) -> dict:
    return {"n": len(xs), "min": min(xs), "max": max(xs), "mean": round(sum(xs) / len(xs), 1)} if xs else {}


def _train_task_range(count: int) -> tuple[int, int]:
    from agent_r.envs import get_env

    train = get_env("textcraft").split_indices("train")
    return train[0], train[count - 1] + 1


def _collection_run(backend, meter, args, concurrency: int, out_dir: Path,
                    record: Path | None = None) -> tuple[dict, list]:
    """A real mcts_collection run (search.collect_trees, what the script calls), in-process, on the
    already-loaded backend; with ``record``, every generate call's requests and sampling go to that
    JSONL file, in order, for ``replay`` in a fresh process."""
    from agent_r import paths
    from agent_r.llm import HFBackend
    from agent_r.search import SearchSettings, collect_trees
    from agent_r.settings import parse

    captured: list = []
    orig_generate = HFBackend.generate

    calls: list[str] = []

    def capture(self, requests, sampling):
        if not captured:
            captured.append((list(requests), sampling))
        if record is not None:
            calls.append(json.dumps({"requests": [dataclasses.asdict(r) for r in requests],
                                     "sampling": dataclasses.asdict(sampling)}))
        return orig_generate(self, requests, sampling)

    if out_dir.exists():
        shutil.rmtree(out_dir)                           # a fresh search, never a resumed one
    lo, hi = _train_task_range(concurrency)
    environ = dict(TASK="textcraft", MAX_DEPTH=str(args.max_depth), ITERA=str(args.itera),
                   N_GEN=str(args.n_gen), TEMP="1.0", MODEL_NAME="bench")
    argv = ["--backend", "hf", "--env_server_base", args.server, "--min", str(lo), "--max", str(hi),
            "--concurrency", str(concurrency), "--max_new_tokens", str(args.max_new_tokens),
            "--output_dir", str(out_dir), "--seed", "0"]
    HFBackend.generate = capture
    meter.reset()
    try:
        t0 = time.perf_counter()
        summary = collect_trees(parse(SearchSettings, argv, environ), backend=backend)  # not closed: reused
        rc = 1 if summary.failed else 0
        wall = time.perf_counter() - t0
    finally:
        HFBackend.generate = orig_generate
    result = meter.snapshot(wall)
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text("\n".join(calls) + "\n")
        result["recorded"] = str(record)
    manifest = json.loads(paths.manifest_file(summary.out_dir).read_text())
    trees = [path for _, path in paths.tree_files(summary.out_dir)]
    tree_tokens = 0
    for path in trees:
        stack = [json.loads(path.read_text())]
        while stack:
            node = stack.pop()
            if node.get("llm_response"):
                tree_tokens += len(backend.tokenizer(node["llm_response"], add_special_tokens=False)["input_ids"])
            stack.extend(node.get("children", []))
    result.update(rc=rc, tasks=[lo, hi], trees=len(trees), argv=" ".join(argv),
                  env=f"MAX_DEPTH={args.max_depth} ITERA={args.itera} N_GEN={args.n_gen} TEMP=1.0",
                  mean_batch_requests=manifest.get("stats", {}).get("mean_batch"),
                  tokens_in_written_trees=tree_tokens)
    return result, captured


def _pure_run(backend, meter, requests, sampling, batch_size: int, repeats: int, force: bool = True,
              warm: bool = True) -> dict:
    """backend.generate on exactly the collection's first batch, every sample
    forced to max_new_tokens (generation_config.min_new_tokens) unless not ``force``."""
    gc = backend.model.generation_config
    old_bs, old_min, old_cache = backend.batch_size, getattr(gc, "min_new_tokens", None), backend.prefix_cache
    backend.batch_size = batch_size
    backend.prefix_cache = None   # pure generation: every repeat computes its prompts (no reuse between calls)
    if force:
        gc.min_new_tokens = sampling.max_new_tokens
    try:
        if warm:
            backend.generate(requests, sampling)       # warm-up at this shape
        meter.reset()
        t0 = time.perf_counter()
        for _ in range(repeats):
            backend.generate(requests, sampling)
        cuda_sync()
        wall = time.perf_counter() - t0
    finally:
        backend.batch_size, gc.min_new_tokens, backend.prefix_cache = old_bs, old_min, old_cache
    res = meter.snapshot(wall)
    res.update(batch_size=batch_size, repeats=repeats, samples=sum(r.n for r in requests), forced_length=force,
               warm_up=warm)
    return res


def cmd_throughput(args) -> None:
    import gc as pygc

    import torch
    from agent_r.llm import SamplingConfig, make_backend
    from agent_r.knobs import BackendSettings

    label = args.label
    t0 = time.perf_counter()
    backend = make_backend(BackendSettings(backend="hf", model_dir=args.model), seed=0)
    load_s = time.perf_counter() - t0
    meter = Meter(backend)
    # gc_frozen_objects > 0 shows the backend's gc.freeze() after load ran (the GC fix under test)
    res: dict = {"model": args.model, "backend": backend.describe(), "load_s": round(load_s, 2),
                 "max_new_tokens": args.max_new_tokens, "gc_frozen_objects": pygc.get_freeze_count(), "runs": {}}
    save_results(args.results, f"throughput_{label}", res)
    # one warm-up generate (CUDA context, kernels) before anything is timed
    from agent_r.llm import GenerationRequest

    backend.generate([GenerationRequest([{"role": "user", "content": "warm up"}], n=2)],
                     SamplingConfig(temperature=1.0, max_new_tokens=8))
    if args.prewarm_gib and torch.cuda.is_available():
        # Fill PyTorch's caching allocator with one big segment that later
        # allocations are split from: no cudaMalloc while the KV cache grows.
        t0 = time.perf_counter()
        x = torch.empty(int(args.prewarm_gib * 2**30), dtype=torch.uint8, device="cuda")
        del x
        res["prewarm"] = {"gib": args.prewarm_gib, "s": round(time.perf_counter() - t0, 3),
                          "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2)}
    work = Path(args.workdir) / f"tp_{label}"
    default_bs = backend.batch_size
    for b in [int(x) for x in args.batches.split(",")]:
        if time_left(args) < args.reserve_s:
            res["runs"][f"B{b}"] = {"skipped": f"time budget ({time_left(args):.0f}s left)"}
            save_results(args.results, f"throughput_{label}", res)
            continue
        conc = max(1, b // args.n_gen)
        run: dict = {"concurrency": conc, "n_gen": args.n_gen, "samples_per_call": conc * args.n_gen}
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        # (ii) collection as shipped (backend batch_size default), then with batch_size = B. Sizes
        # are the sequences one generate really gets: the GPU default (0 = a whole call, stored as
        # 1 << 30) is the same run as batch_size = B, so it is run once and keyed bs{B}.
        sizes = [min(default_bs, b)] + ([b] if default_bs < b else [])
        captured = None
        for bs in sizes:
            backend.batch_size = bs
            record = Path(args.record_dir) / f"calls_{label}_B{b}.jsonl" if args.record_dir and bs == sizes[0] else None
            col, cap = _collection_run(backend, meter, args, conc, work / f"B{b}_bs{bs}", record)
            backend.batch_size = default_bs
            run[f"collection_bs{bs}"] = col
            captured = captured or cap
            save_results(args.results, f"throughput_{label}", res | {"runs": res["runs"] | {f"B{b}": run}})
        # (i) pure batched generation on the same first batch
        requests, sampling = captured[0]
        for bs in sizes:
            run[f"pure_bs{bs}"] = _pure_run(backend, meter, requests, sampling, bs, args.repeats)
        for bs in sizes:
            pure, col = run[f"pure_bs{bs}"]["tokens_per_s"], run[f"collection_bs{bs}"]["tokens_per_s"]
            run[f"ratio_bs{bs}"] = round(col / pure, 3) if pure else None
        best_pure = max(run[f"pure_bs{bs}"]["tokens_per_s"] for bs in sizes)
        run["shipped_bs"] = sizes[0]
        run["ratio_shipped_vs_best_pure"] = round(run[f"collection_bs{sizes[0]}"]["tokens_per_s"] / best_pure, 3)
        if torch.cuda.is_available():
            run["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        res["runs"][f"B{b}"] = run
        save_results(args.results, f"throughput_{label}", res)
        if args.diagnose:
            # why collection decode steps are slower than pure ones: the same batch
            # without forced length / warm-up, then collection with Python's GC frozen
            run["pure_unforced_cold"] = _pure_run(backend, meter, requests, sampling, sizes[0], 1,
                                                  force=False, warm=False)
            save_results(args.results, f"throughput_{label}", res)
            pygc.collect()
            pygc.freeze()
            pygc.disable()
            try:
                run["collection_gc_frozen"], _ = _collection_run(backend, meter, args, conc, work / f"B{b}_gcfrozen")
            finally:
                pygc.enable()   # no unfreeze: the hf backend itself runs with gc.freeze() since load
            save_results(args.results, f"throughput_{label}", res)
    backend.close()


# ----------------------------------------------------------------------------- replay

REPLAY_VARIANTS = ("recorded", "nocache", "sorted", "nostop", "greedy")


def _replayed(calls: list[dict], variant: str) -> list[tuple[list, Any]]:
    """The recorded calls with one factor changed: ``sorted`` orders each call's requests by
    prompt length (less left padding per chunk), ``nostop`` drops the stop strings (their
    criteria run every decoding step), ``greedy`` decodes at temperature 0; ``recorded`` and
    ``nocache`` (the backend's prefix cache off) replay them as they were."""
    from agent_r.llm import GenerationRequest, SamplingConfig

    out = []
    for call in calls:
        requests = [GenerationRequest(**r) for r in call["requests"]]
        sampling = SamplingConfig(**{**call["sampling"], "stop": tuple(call["sampling"]["stop"])})
        if variant == "sorted":
            requests.sort(key=lambda r: sum(len(m["content"]) for m in r.messages))
        elif variant == "nostop":
            sampling = dataclasses.replace(sampling, stop=())
        elif variant == "greedy":
            sampling = dataclasses.replace(sampling, temperature=0.0)
        out.append((requests, sampling))
    return out


def _profiled_call(fn: Any, trace: Path) -> dict:
    """``fn()`` under torch.profiler (CPU, and CUDA where there is one): the chrome trace to
    ``trace`` (gzipped); the top operators by self CPU time, the host syncs that leave the GPU
    idle between kernels, the garbage collections inside it."""
    import gc as pygc
    import threading

    import torch
    from torch.profiler import ProfilerActivity, profile

    collections = []
    hook = lambda phase, info: phase == "start" and collections.append(info["generation"])  # noqa: E731
    pygc.callbacks.append(hook)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    try:
        with profile(activities=activities, with_stack=True) as prof:
            fn()
            cuda_sync()
    finally:
        pygc.callbacks.remove(hook)
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    subprocess.run(["gzip", "-f", str(trace)], check=True)   # what comes back from a GPU call is limited
    ops = prof.key_averages()
    counts = {e.key: e.count for e in ops if e.key in ("aten::item", "aten::_local_scalar_dense",
                                                       "cudaStreamSynchronize", "cudaDeviceSynchronize")}
    top = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:20]
    return {"trace": f"{trace}.gz", "host_syncs": counts, "gc_collections_by_generation": collections,
            "threads": threading.active_count(),
            "top_self_cpu_ms": [[e.key, e.count, round(e.self_cpu_time_total / 1000, 2)] for e in top]}


def cmd_replay(args) -> None:
    """The recorded search calls replayed in a fresh process (split "the inputs" from "the
    process"), once per variant, each with an empty prefix cache; ``--profile_call K`` also
    profiles call K of the ``recorded`` replay."""
    from agent_r.knobs import BackendSettings
    from agent_r.llm import SamplingConfig, make_backend
    from agent_r.llm.prefix_cache import PrefixCache

    calls = [json.loads(line) for line in Path(args.calls).read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    backend = make_backend(BackendSettings(backend="hf", model_dir=args.model), seed=0)
    res: dict = {"model": args.model, "calls": args.calls, "n_calls": len(calls), "backend": backend.describe(),
                 "load_s": round(time.perf_counter() - t0, 2), "variants": {}}
    key = f"replay_{args.label}"
    save_results(args.results, key, res)
    meter = Meter(backend)
    from agent_r.llm import GenerationRequest

    backend.generate([GenerationRequest([{"role": "user", "content": "warm up"}], n=2)],
                     SamplingConfig(temperature=1.0, max_new_tokens=8))
    budget = backend.prefix_cache.budget_bytes if backend.prefix_cache else 0
    for variant in args.variants.split(","):
        if variant not in REPLAY_VARIANTS:
            raise SystemExit(f"unknown replay variant {variant!r}: one of {', '.join(REPLAY_VARIANTS)}")
        if time_left(args) < args.reserve_s:
            res["variants"][variant] = {"skipped": f"time budget ({time_left(args):.0f}s left)"}
            continue
        backend.prefix_cache = PrefixCache(budget) if budget and variant != "nocache" else None
        meter.reset()
        start = time.perf_counter()
        done = 0
        for i, (requests, sampling) in enumerate(_replayed(calls, variant)):
            if time_left(args) < args.reserve_s:
                break
            if variant == "recorded" and i == args.profile_call:
                res["profile"] = _profiled_call(lambda: backend.generate(requests, sampling),
                                                Path(args.workdir) / f"trace_{args.label}_call{i}.json")
            else:
                backend.generate(requests, sampling)
            done += 1
        cuda_sync()
        snap = meter.snapshot(time.perf_counter() - start)
        snap.update(calls_replayed=done)
        res["variants"][variant] = snap
        save_results(args.results, key, res)
    backend.close()


# ----------------------------------------------------------------------------- trainer rate

def cmd_trainer_rate(args) -> None:
    """The in-process trainer's loop (agent_r/training/cpu.py: what TRAIN_DEVICE=cuda runs) on
    --data with the run's LoRA recipe, the first --train_steps optimizer steps per batching
    variant BxA (BATCH_SIZE x ACCUMULATIVE_COUNTS: B*A*MAX_LENGTH tokens of samples per step
    either way, A forwards of up to B*MAX_LENGTH tokens each): tokens/s, s/step, each step's
    loss (the same data and seed, so the curves can be compared step by step), and one step
    of the first variant under torch.profiler."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_r.llm.model_files import model_dtype
    from agent_r.training import cpu
    from agent_r.training.adapter import Lora
    from agent_r.training.data import training_records
    from agent_r.training.settings import TrainKnobs

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.model)
    data = cpu.examples(training_records([args.data], "", 0.0, 0)[0], tok, args.max_length)
    autocast = (model_dtype(args.model) or "float32") == "bfloat16" and device != "cpu"
    key = f"trainer_rate_{args.label}"
    res: dict = {"model": args.model, "data": args.data, "samples": len(data), "device": device,
                 "precision": "bf16 autocast, fp32 weights" if autocast else "fp32", "lora_rank": args.lora_rank,
                 "variants": {}}
    save_results(args.results, key, res)
    for n, variant in enumerate(args.train_variants.split(",")):
        if time_left(args) < args.reserve_s:
            res["variants"][variant] = {"skipped": f"time budget ({time_left(args):.0f}s left)"}
            continue
        batch, accum = (int(x) for x in variant.split("x"))
        knobs = TrainKnobs(lr=args.lr, epochs=1, max_length=args.max_length, batch_size=batch,
                           accumulative_counts=accum, warmup_ratio=0.03, general_data="", eta=0.0)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
        if args.lora_rank:
            Lora(rank=args.lora_rank, alpha=2 * args.lora_rank).wrap(model)
        steps = cpu.plan_steps(data, knobs, 0)[:args.train_steps]
        tokens = sum(len(ex.ids) for step in steps for b in step for ex in b)
        if n == 0 and args.profile_step and len(steps) > 1:   # one step traced, not timed
            res["profile"] = _profiled_call(lambda: cpu.fit(model, steps[:1], knobs, tok.pad_token_id,
                                                            bf16_autocast=autocast),
                                            Path(args.workdir) / f"trace_{args.label}_train_step.json")
            steps, tokens = steps[1:], tokens - sum(len(ex.ids) for b in steps[0] for ex in b)
        cuda_sync()
        t0 = time.perf_counter()
        losses = cpu.fit(model, steps, knobs, tok.pad_token_id, bf16_autocast=autocast)
        cuda_sync()
        seconds = time.perf_counter() - t0
        res["variants"][variant] = {"steps": len(steps), "tokens": tokens, "seconds": round(seconds, 2),
                                    "s_per_step": round(seconds / max(1, len(steps)), 3),
                                    "tokens_per_s": round(tokens / seconds, 1), "losses": [round(x, 4) for x in losses],
                                    "forwards_per_step": round(sum(len(st) for st in steps) / max(1, len(steps)), 2),
                                    "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                                    if device == "cuda" else None}
        save_results(args.results, key, res)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- pipeline

def run_step(name: str, cmd: list[str], env: dict, logdir: Path, cwd: Path = ROOT, timeout: float = 600,
             deadline: float = 0) -> dict:
    if deadline:
        timeout = max(10.0, min(timeout, deadline - time.time() - 5))
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"{name}.log"
    print(f"[bench_gpu] $ {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    lines = text.splitlines()
    tb = []
    if "Traceback (most recent call last)" in text:
        start = text.rindex("Traceback (most recent call last)")
        tb = text[start:].splitlines()[:60]
    errors = [ln for ln in lines if re.search(r"\b(ERROR|Error|error:)", ln)][:15]
    res = {"cmd": " ".join(cmd), "rc": rc, "wall_s": round(wall, 2), "tail": lines[-8:], "traceback": tb,
           "error_lines": errors}
    print(f"[bench_gpu] {name}: rc={rc} wall={wall:.1f}s", flush=True)
    for ln in lines[-6:]:
        print(f"    {ln}", flush=True)
    return res


def hf_fp32(model_dir: str, **options):
    """--backend python:bench.bench_gpu:hf_fp32 — the hf backend forced to fp32
    (to compare with the hf backend's own default dtype on a GPU)."""
    from agent_r.llm import HFBackend, resolve_model_dir

    options = {k: v for k, v in options.items() if k in ("device", "batch_size", "seed")}
    return HFBackend(resolve_model_dir(model_dir), dtype="float32", **options)


def cmd_pipeline(args) -> None:
    from agent_r import paths

    py = sys.executable
    w = Path(args.workdir) / "pipeline"
    if args.fresh and w.exists():
        shutil.rmtree(w)
    logs = Path(args.logdir)
    base = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "MODEL_NAME", "TEMP", "BACKEND")}
    base.update(TASK="textcraft", PYTHONUNBUFFERED="1", PYTHONPATH=f"{ROOT}{os.pathsep}{base.get('PYTHONPATH', '')}")
    url = args.server
    m1 = str(Path(args.model).resolve())
    m1_name = Path(m1).name
    search = dict(ITERA=str(args.itera), MAX_DEPTH=str(args.max_depth), N_GEN=str(args.n_gen), TEMP="1.0")
    steps: list[tuple[str, list[str], dict]] = [
        ("mcts_tiny", [py, "mcts_collection.py", "--backend", "hf", "--env_server_base", url, "--min", "0",
                       "--max", str(args.tiny_max), "--concurrency", "16", "--max_new_tokens", "100",
                       "--output_dir", str(w / "mcts_result")],
         dict(ITERA="4", N_GEN="4", MAX_DEPTH="12", TEMP="1.0", MAX_TOKEN_LENGTH="2048")),
        ("centric_tiny_trees_1b_verifier", [py, "path_collection.py", "--backend", "hf", "--data_type", "centric",
                                            "--revise", "1", "--input_dir", str(w / "mcts_result/textcraft/textcraft-tiny"),
                                            "--output_dir", str(w / "data_tiny"), "--max_new_tokens", "100"],
         dict(MODEL_DIR=m1)),
        ("good_tiny_trees", [py, "path_collection.py", "--data_type", "good",
                             "--input_dir", str(w / "mcts_result/textcraft/textcraft-tiny"),
                             "--output_dir", str(w / "data_tiny")], {}),
        ("export_tiny_trees", [py, "path_collection.py", "export", "--format", "xtuner", "--input",
                               str(w / "data_tiny/textcraft_centric.jsonl"), str(w / "data_tiny/textcraft_good.jsonl"),
                               "--output", str(w / "train.json")], {}),
        ("mcts_1b", [py, "mcts_collection.py", "--backend", "hf", "--env_server_base", url, "--min", "0",
                     "--max", str(args.mcts_max), "--concurrency", "8", "--max_new_tokens", str(args.max_new_tokens),
                     "--output_dir", str(w / "mcts_result")], dict(MODEL_DIR=m1, **search)),
        ("centric_1b_trees", [py, "path_collection.py", "--backend", "hf", "--data_type", "centric", "--revise", "1",
                              "--input_dir", str(w / "mcts_result/textcraft" / m1_name),
                              "--output_dir", str(w / "data_1b"), "--max_new_tokens", str(args.max_new_tokens)],
         dict(MODEL_DIR=m1)),
        ("good_1b_trees", [py, "path_collection.py", "--data_type", "good",
                           "--input_dir", str(w / "mcts_result/textcraft" / m1_name), "--output_dir", str(w / "data_1b")],
         dict(MODEL_DIR=m1)),
        ("export_1b_trees", [py, "path_collection.py", "export", "--format", "xtuner", "--input",
                             str(w / "data_1b/textcraft_centric.jsonl"), str(w / "data_1b/textcraft_good.jsonl"),
                             "--output", str(w / "train_1b.json")], {}),
        ("eval_1b", [py, "eval.py", "--backend", "hf", "--env_server_base", url, "--limit", "8",
                     "--max_steps", str(args.eval_max_steps), "--max_new_tokens", str(args.max_new_tokens),
                     "--output_dir", str(w / "test_result")], dict(MODEL_DIR=m1, TEMP="1.0", MODEL_TYPE="gpu")),
        # the bundled fp32-trained model on the GPU, the hf backend's default dtype vs fp32,
        # same settings as its CPU figure in RESULTS.md (16.0 greedy on the 100 test tasks)
        ("eval_tiny_default_dtype", [py, "eval.py", "--backend", "hf", "--env_server_base", url, "--max_steps", "12",
                                     "--max_new_tokens", "60", "--concurrency", "50",
                                     "--output_dir", str(w / "test_result")] + (["--limit", str(args.tiny_eval_limit)]
                                                                               if args.tiny_eval_limit else []),
         dict(TEMP="0", MODEL_TYPE="default_dtype")),
        ("eval_tiny_fp32", [py, "eval.py", "--backend", "python:bench.bench_gpu:hf_fp32", "--env_server_base", url,
                            "--max_steps", "12", "--max_new_tokens", "60", "--concurrency", "50",
                            "--output_dir", str(w / "test_result")] + (["--limit", str(args.tiny_eval_limit)]
                                                                      if args.tiny_eval_limit else []),
         dict(TEMP="0", MODEL_TYPE="fp32")),
    ]
    if args.steps:
        wanted = args.steps.split(",")
        steps = [s for s in steps if s[0] in wanted]
    res: dict = load_results(args.results).get(args.key) or {"workdir": str(w), "steps": {}}
    for name, cmd, extra in steps:
        if time_left(args) < args.reserve_s:
            res["steps"][name] = {"skipped": f"time budget ({time_left(args):.0f}s left)"}
            continue
        res["steps"][name] = run_step(name, cmd, {**base, **extra}, logs, deadline=args.deadline)
        save_results(args.results, args.key, res)
    # what the outputs hold
    facts: dict = {}
    for mf in (w / "mcts_result/textcraft").glob(f"*/{paths.MANIFEST}"):
        m = json.loads(mf.read_text())
        facts[f"manifest_{mf.parent.name}"] = {k: m.get(k) for k in ("backend", "stats")}
    for f in sorted(w.glob("data_*/*.jsonl")):
        facts[f"lines_{f.parent.name}/{f.name}"] = sum(1 for _ in open(f))
    for f in sorted(w.glob("train*.json")):
        facts[f"samples_{f.name}"] = len(json.loads(f.read_text()))
    for s in sorted((w / "test_result").rglob(paths.SUMMARY)):
        facts[f"eval_{s.parent.name}"] = json.loads(s.read_text())
    for name in ("mcts_1b", "eval_1b"):
        log = logs / f"{name}.log"
        if log.exists():
            facts[f"{name}_log_mentions_device_or_dtype"] = [
                ln for ln in log.read_text(errors="replace").splitlines()
                if re.search(r"cuda|bfloat16|float32|dtype", ln)][:5]
    res["facts"] = facts
    save_results(args.results, args.key, res)


# ----------------------------------------------------------------------------- train

def _per_iter_times(logged: list[float], window: int = 10) -> list[float]:
    """mmengine logs ``time`` as the mean over its last ``window`` (10)
    iterations; undo that to get each iteration's own time."""
    out: list[float] = []
    for i, m in enumerate(logged):
        if i < window:
            out.append((i + 1) * m - i * (logged[i - 1] if i else 0.0))
        else:
            out.append(window * (m - logged[i - 1]) + out[i - window])
    return out


def cmd_train(args) -> None:
    w = Path(args.workdir) / "train"
    if w.exists():
        shutil.rmtree(w)
    w.mkdir(parents=True)
    logs = Path(args.logdir)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MODEL_DIR", "DATA_FILES", "CONFIG", "DEEPSPEED", "WORK_DIR", "HF_DIR")}
    # train.sh (and xtuner) run a bare `python`: the training interpreter first on PATH
    shim = w / "bin"
    shim.mkdir()
    (shim / "python").write_text(f'#!/bin/sh\nexec "{args.train_python}" "$@"\n')
    (shim / "python").chmod(0o755)
    env.update(PATH=os.pathsep.join([str(shim), str(Path(args.train_python).parent), env["PATH"]]),
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if args.train_pythonpath:
        env["PYTHONPATH"] = args.train_pythonpath
    res: dict = {"train_python": args.train_python, "train_pythonpath": args.train_pythonpath}
    probe = ("import sys, torch, torchvision, transformers, deepspeed, mmengine, xtuner, xtuner.dataset, peft; "
             "import importlib.util as u; "
             "print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', "
             "transformers.__version__, 'deepspeed', deepspeed.__version__, 'mmengine', mmengine.__version__, "
             "'xtuner', xtuner.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available(), "
             "'bitsandbytes', u.find_spec('bitsandbytes') is not None, 'torchvision_from', torchvision.__file__)")
    res["imports"] = run_step("train_imports", ["python", "-c", probe], env, logs, timeout=300)
    save_results(args.results, "train", res)
    data = Path(args.data)
    if not data.exists() or not json.loads(data.read_text()):
        res["skipped"] = f"no training data at {data}"
        save_results(args.results, "train", res)
        return
    hf = w / "work" / "hf"
    env.update(MODEL_DIR=str(Path(args.model).resolve()), DATA_FILES=str(data.resolve()), WORK_DIR=str(w / "work"),
               EPOCHS=str(args.epochs), MAX_LENGTH=str(args.max_length), BATCH_SIZE="1", ACCUMULATIVE_COUNTS="1",
               WARMUP_RATIO="0", MAP_NUM_PROC="4", SAVE_STEPS="100000", PORT="29512", LR="1e-5")
    if args.config:
        env["CONFIG"] = args.config
    if args.deepspeed:
        env["DEEPSPEED"] = args.deepspeed
    res["settings"] = {k: env[k] for k in ("MODEL_DIR", "DATA_FILES", "EPOCHS", "MAX_LENGTH", "BATCH_SIZE",
                                           "ACCUMULATIVE_COUNTS", "WARMUP_RATIO", "LR")} | {
        "CONFIG": env.get("CONFIG", "xtuner_config/agent_r_llama3_8b_full.py (default)"),
        "DEEPSPEED": env.get("DEEPSPEED", "deepspeed_zero2 (default)")}
    res["train_sh"] = run_step("train_sh", ["bash", "xtuner_config/train.sh", "--cfg-options",
                                            "default_hooks.logger.interval=1"], env, logs, timeout=args.train_timeout,
                        deadline=args.deadline)
    scalars = sorted((w / "work").rglob("scalars.json"))
    iters = [json.loads(ln) for f in scalars for ln in f.read_text().splitlines() if '"loss"' in ln]
    if iters:
        res["iterations"] = len(iters)
        res["losses"] = [round(it["loss"], 4) for it in iters]
        if all("time" in it for it in iters):
            times = _per_iter_times([it["time"] for it in iters])
            res["iter_time_s"] = [round(t, 3) for t in times]
            steady = times[1:] or times
            res["steps_per_s_after_first"] = round(len(steady) / sum(steady), 2)
            res["train_loop_s"] = round(sum(times), 2)
        res["log_keys"] = sorted(iters[-1])
    res["hf_dir_files"] = sorted(p.name for p in hf.iterdir()) if hf.exists() else None
    save_results(args.results, "train", res)
    if not hf.exists():
        return
    # reload the converted model with the project's hf backend (collection env) and generate once
    reload = (
        "import json, sys, time; "
        "from agent_r.llm import make_backend, GenerationRequest, SamplingConfig; "
        "from agent_r.knobs import BackendSettings; "
        "t=time.time(); b=make_backend(BackendSettings(backend='hf', model_dir=sys.argv[1]), seed=0); "
        "out=b.generate([GenerationRequest([{'role':'user','content':'Crafting commands: craft 1 stick using 2 planks. Goal: craft stick.'}], n=2)], "
        "SamplingConfig(temperature=1.0, max_new_tokens=32)); "
        "print('RELOAD', json.dumps({'describe': b.describe(), 'texts': out, 's': round(time.time()-t, 2)}))")
    renv = {k: v for k, v in os.environ.items()}
    res["reload"] = run_step("reload_hf", [args.collect_python, "-c", reload, str(hf)], renv, logs, timeout=300)
    save_results(args.results, "train", res)


# ----------------------------------------------------------------------------- main

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("phase", choices=["info", "build", "throughput", "replay", "trainer_rate", "pipeline", "train"])
    p.add_argument("--results", type=Path, default=Path("gpu_results.json"))
    p.add_argument("--deadline", type=float, default=0, help="epoch seconds; later phases/steps are skipped")
    p.add_argument("--reserve_s", type=float, default=30)
    p.add_argument("--workdir", default="/tmp/bench_gpu")
    p.add_argument("--logdir", default="/tmp/bench_gpu/logs")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    p.add_argument("--out")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--model")
    p.add_argument("--label", default="model")
    p.add_argument("--server", default="http://127.0.0.1:36001")
    p.add_argument("--batches", default="16,64")
    p.add_argument("--n_gen", type=int, default=4)
    p.add_argument("--itera", type=int, default=2)
    p.add_argument("--max_depth", type=int, default=3)
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--record_dir", default="", help="throughput: record the shipped search's calls here (JSONL)")
    p.add_argument("--calls", help="replay: a recorded calls_<label>_B<b>.jsonl")
    p.add_argument("--variants", default=",".join(REPLAY_VARIANTS), help="replay: comma list")
    p.add_argument("--profile_call", type=int, default=-1, help="replay: profile this call of the recorded replay")
    p.add_argument("--train_variants", default="1x16,16x1,4x4", help="trainer_rate: BATCH_SIZExACCUMULATIVE_COUNTS")
    p.add_argument("--train_steps", type=int, default=6, help="trainer_rate: optimizer steps per variant")
    p.add_argument("--profile_step", type=int, default=1, help="trainer_rate: 1 = trace the first variant's first step")
    p.add_argument("--lora_rank", type=int, default=16, help="trainer_rate: 0 = full fine-tune")
    p.add_argument("--lr", type=float, default=3e-3, help="trainer_rate: the SmolLM2 run's LoRA LR")
    p.add_argument("--diagnose", action="store_true", help="throughput: extra runs (unforced pure, GC frozen)")
    p.add_argument("--prewarm_gib", type=float, default=0, help="reserve this much in the CUDA caching allocator first")
    p.add_argument("--mcts_max", type=int, default=6)
    p.add_argument("--tiny_max", type=int, default=20)
    p.add_argument("--tiny_eval_limit", type=int, default=0)
    p.add_argument("--eval_max_steps", type=int, default=10)
    p.add_argument("--data")
    p.add_argument("--steps", default="", help="pipeline: only these steps (comma list)")
    p.add_argument("--key", default="pipeline", help="pipeline: results key (steps are merged into it)")
    p.add_argument("--fresh", action="store_true", help="pipeline: start from an empty work folder")
    p.add_argument("--train_python", default=shutil.which("python3"))
    p.add_argument("--train_pythonpath", default="")
    p.add_argument("--collect_python", default=sys.executable)
    p.add_argument("--config", default="")
    p.add_argument("--deepspeed", default="")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max_length", type=int, default=2048)
    p.add_argument("--train_timeout", type=float, default=420)
    args = p.parse_args()
    os.chdir(ROOT)
    {"info": cmd_info, "build": cmd_build, "throughput": cmd_throughput, "replay": cmd_replay,
     "trainer_rate": cmd_trainer_rate,
     "pipeline": cmd_pipeline,
     "train": cmd_train}[args.phase](args)


if __name__ == "__main__":
    main()
