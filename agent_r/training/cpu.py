"""The in-process trainer (``TRAINER=cpu``): a small full fine-tuning loop for
tiny models, reading the same exported XTuner JSON as XTuner's config and
encoding it in the model's own chat format, as XTuner does.

Why it exists: XTuner on CPU trains the bundled 3M-parameter model about five
times slower per token than a plain loop (packed 2048-token sequences with
attention across samples, activation checkpointing, fp32 shims) and spends a
minute starting up and converting each run (docs/iterate.md has the numbers),
so ``iterate.py`` on a 2-core box could not fit a self-training iteration in
minutes. This trainer stands in for it there; a cluster uses XTuner
(``TRAINER=xtuner``). Its optimizer loop (``train_steps``) is also the one the
bundled models are trained from scratch with (scripts/train_tiny_model.py);
TRL took 1.5-2.4x its time per epoch on CPU (bench/RESULTS.md).

What must not differ from inference or from XTuner is what is learned from
which token. Each sample is encoded in the model's own chat format
(``agent_r.llm.chat.ChatFormat``, read from its chat template): the tokens
before a trained turn are the prompt inference gives that history, the
assistant text and the model's own end-of-turn token are trained exactly when
the message's ``loss`` is true, system/user text never is, a sample is cut at
``max_length``, samples with nothing to train are dropped. For a Llama-3 or
ChatML model this is token for token what XTuner's ``openai_map_fn`` +
``llama3_chat``/``qwen_chat`` + ``encode_fn`` build (tests/training/
test_cpu_trainer.py and tests/training/test_chat_formats.py compare them). The
rows (agent samples plus general data at ETA) come from the same function
XTuner's config uses (``agent_r.training.data.training_records``).

Steps mirror XTuner's packed steps: one step takes shuffled samples up to
``max_length x batch_size`` tokens (a "packed" batch, here without attention
across samples) times ``accumulative_counts``; AdamW (betas 0.9/0.999, no
weight decay), gradient clip 1, linear warm-up from 1e-5 x LR over
``warmup_ratio`` of the steps, then cosine to 0. Samples of a batch share
their system prompt and instruction, which is run once per batch (the prefix
cache), so a step costs little more than its trained tokens.

Precision: a model saved in bfloat16 (SmolLM2) trains under bf16 autocast on
a CPU with native bf16 (AMX or AVX512-BF16), with fp32 master weights,
gradients and AdamW state, and is saved in bfloat16 again; measured half the
time per step of fp32 (bench/RESULTS.md). Every other model trains and is
saved in fp32 as before.
"""
from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from agent_r.llm.chat import IGNORE, ChatFormat
from agent_r.llm.model_files import cpu_bf16_native, model_dtype
from agent_r.manifest import machine
from agent_r.settings import UsageError
from agent_r.training.adapter import lora_record, save_merged
from agent_r.training.checkpoint import StepCheckpoint, inputs_key
from agent_r.training.data import training_records
from agent_r.training.saving import save_model
from agent_r.training.settings import TrainKnobs, check_warmup

log = logging.getLogger(__name__)

@dataclass
class Example:
    """One encoded sample and the key of the prefix it shares with others."""

    ids: list[int]
    labels: list[int]
    group: str          # samples with the same system prompt and instruction share a batch


def examples(records: list[dict], tokenizer: Any, max_length: int) -> list[Example]:
    """The samples to train on, in order, in the model's own chat format
    (``ChatFormat``); those with nothing to train are dropped, as XTuner does."""
    fmt = ChatFormat(tokenizer)
    out = []
    for r in records:
        ids, labels = fmt.encode(r["messages"], max_length)
        if any(y != IGNORE for y in labels):   # XTuner drops samples with nothing to train
            users = [m["content"] for m in r["messages"] if m["role"] in ("system", "user")]
            out.append(Example(ids, labels, "\n".join(users[:2])))
    return out


# --------------------------------------------------------------------------- batching

def epoch_batches(data: list[Example], budget: int, rng: random.Random) -> list[list[Example]]:
    """One epoch: shuffled, grouped by shared prefix, filled up to ``budget``
    tokens per batch (at least one sample), batch order shuffled."""
    order = list(range(len(data)))
    rng.shuffle(order)
    by_group: dict[str, list[Example]] = {}
    for i in order:
        by_group.setdefault(data[i].group, []).append(data[i])
    batches = []
    for members in by_group.values():
        cur, size = [], 0
        for ex in members:
            if cur and size + len(ex.ids) > budget:
                batches.append(cur)
                cur, size = [], 0
            cur.append(ex)
            size += len(ex.ids)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def common_prefix(batch: list[Example]) -> int:
    """Untrained leading tokens all samples of the batch share (at least one
    token is left to each sample, so every row predicts something)."""
    n = min(len(ex.ids) for ex in batch) - 1
    first = batch[0]
    k = 0
    while k < n and all(ex.ids[k] == first.ids[k] for ex in batch) and all(ex.labels[k + 1] == IGNORE for ex in batch):
        k += 1
    return k


def batch_loss(model: Any, batch: list[Example], pad_id: int) -> tuple[Any, int]:
    """(sum of token losses, trained tokens) of one batch; the shared prefix
    runs once and its key/value cache is repeated for every sample."""
    import torch

    skip = common_prefix(batch)
    q = max(len(ex.ids) for ex in batch) - skip
    ids = torch.full((len(batch), q), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), q), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), skip + q), dtype=torch.long)
    mask[:, :skip] = 1
    for i, ex in enumerate(batch):
        n = len(ex.ids) - skip
        ids[i, :n] = torch.tensor(ex.ids[skip:])
        labels[i, :n] = torch.tensor(ex.labels[skip:])
        mask[i, skip:skip + n] = 1
    device = model.lm_head.weight.device
    ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
    cache = None
    if skip:
        cache = model.model(input_ids=torch.tensor([batch[0].ids[:skip]], device=device),
                            use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(batch))
    positions = torch.arange(skip, skip + q, device=device).unsqueeze(0).expand(len(batch), q)
    hidden = model.model(input_ids=ids, attention_mask=mask, past_key_values=cache, position_ids=positions,
                         use_cache=cache is not None).last_hidden_state
    # position t predicts token t+1; the first suffix token is never trained (common_prefix)
    target = labels[:, 1:]
    keep = target != IGNORE
    logits = model.lm_head(hidden[:, :-1][keep])
    loss = torch.nn.functional.cross_entropy(logits, target[keep], reduction="sum") if keep.any() else hidden.sum() * 0
    return loss, int(keep.sum())


def held_out_loss(model: Any, data: list[Example], pad_id: int, bf16_autocast: bool = False,
                  budget: int = 2048) -> tuple[float, int]:
    """(mean loss per trained token, trained tokens) of ``data`` under
    ``model``, batched as training batches them but without gradients: the
    measure a recipe check compares on samples the fine-tune never saw."""
    import torch

    model.eval()
    device = model.lm_head.weight.device.type
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in epoch_batches(data, budget, random.Random(0)):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16_autocast):
                loss, n = batch_loss(model, batch, pad_id)
            total, tokens = total + float(loss), tokens + n
    return (total / tokens if tokens else float("nan")), tokens


# --------------------------------------------------------------------------- training

def lr_at(step: int, total: int, knobs: TrainKnobs) -> float:
    """XTuner's schedule: linear warm-up from 1e-5 x LR, then cosine to 0."""
    warm = int(knobs.warmup_ratio * total)
    if step < warm:
        return knobs.lr * (1e-5 + (1 - 1e-5) * step / warm)
    progress = (step - warm) / max(1, total - warm)
    return knobs.lr * 0.5 * (1 + math.cos(math.pi * progress))


def plan_steps(data: list[Example], knobs: TrainKnobs, seed: int) -> list[list[list[Example]]]:
    """Every optimizer step of the run: ``accumulative_counts`` batches each."""
    rng = random.Random(seed)
    batches = [b for _ in range(knobs.epochs) for b in epoch_batches(data, knobs.max_length * knobs.batch_size, rng)]
    k = knobs.accumulative_counts
    return [batches[i:i + k] for i in range(0, len(batches), k)]


def train_steps(model: Any, steps: Iterable[list[Any]], loss_of: Callable[[Any], tuple[Any, int]], opt: Any,
                lr_of: Callable[[int], float], total: int, desc: str, first: int = 0,
                after_step: Callable[[int, list[float]], None] | None = None) -> list[float]:
    """The one optimizer loop of the in-process trainers (this fine-tune and
    the bundled models' training from scratch, scripts/train_tiny_model.py):
    per step set the LR, accumulate each batch's mean token loss divided by
    the batches in the step (as mmengine accumulates), clip at 1, step.
    ``loss_of(batch)`` gives (loss summed over ``tokens`` tokens, tokens).
    Steps before ``first`` were run before (a resumed run): skipped.
    ``after_step(steps done, losses)`` runs after each step. Returns each
    step's loss from ``first`` on."""
    import torch
    from tqdm import tqdm

    model.train()
    losses: list[float] = []
    bar = tqdm(steps, total=total, desc=desc, unit="step", initial=first)
    for n, step in enumerate(steps):
        if n < first:
            continue
        for group in opt.param_groups:
            group["lr"] = lr_of(n)
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for batch in step:
            loss, tokens = loss_of(batch)
            mean = loss / max(tokens, 1)
            (mean / len(step)).backward()
            step_loss += mean.item() / len(step)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(step_loss)
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if after_step:
            after_step(n + 1, losses)
    bar.close()
    return losses


def fit(model: Any, steps: list[list[list[Example]]], knobs: TrainKnobs, pad_id: int,
        bf16_autocast: bool = False, checkpoint: StepCheckpoint | None = None) -> list[float]:
    """Runs the fine-tune's steps (AdamW 0.9/0.999, no weight decay, XTuner's
    schedule); returns each step's loss (mean per trained token).
    ``bf16_autocast``: forward passes run under CPU bf16 autocast (matmuls in
    bf16, losses and norms in fp32, torch's autocast lists); the weights the
    optimizer updates stay fp32, so small updates are not rounded away.
    ``checkpoint``: resume from it, and save to it as steps finish."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=knobs.lr, betas=(0.9, 0.999), weight_decay=0.0)
    first, before = checkpoint.resume(model, opt) if checkpoint else (0, [])

    def after_step(done: int, losses: list[float]) -> None:
        if checkpoint:
            checkpoint.maybe_save(done, before + losses, model, opt, last=done == len(steps))

    device = model.lm_head.weight.device.type

    def loss_of(batch: list[Example]) -> tuple[Any, int]:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16_autocast):
            return batch_loss(model, batch, pad_id)

    return before + train_steps(model, steps, loss_of, opt, lambda n: lr_at(n, len(steps), knobs), len(steps),
                                f"fine-tune ({device}, bf16 autocast)" if bf16_autocast else f"fine-tune ({device})",
                                first=first, after_step=after_step)


def precision_of(segments: list[dict] | None, autocast: bool) -> str:
    """The run's precision; a run resumed in another precision names each,
    in the order its steps ran them (its ``segments`` say which steps)."""
    here = "bf16 autocast, fp32 weights" if autocast else "fp32"
    seen = list(dict.fromkeys(s.get("precision", "unrecorded") for s in segments or []))
    return "mixed: " + " then ".join(seen) if len(seen) > 1 else here


def fine_tune(model_dir: str, data_files: list[str], out_dir: str, knobs: TrainKnobs, seed: int = 0,
              threads: int = 0, cpu_bf16: Callable[[], bool] = cpu_bf16_native, lora: Any = None,
              adapter_dir: str | None = None, full_dir: str | None = None, device: str = "cpu",
              checkpoint_dir: str | None = None, checkpoint_s: float = 600.0) -> dict:
    """Fully fine-tune ``model_dir`` on the export files (plus general data
    at ETA); write the model to ``out_dir`` (a Hugging Face directory) in the
    model's own dtype; return the run's statistics. ``threads`` 0 = torch's
    default. A bf16 model trains under bf16 autocast where ``cpu_bf16`` says
    the CPU has native bf16 (module docstring). With ``lora``
    (``agent_r.training.adapter.Lora``) only a low-rank adapter trains; it is
    written to ``adapter_dir`` and merged into the model written to
    ``out_dir`` by ``apply_adapter``, the way a fresh clone rebuilds it.
    With ``lora.full_then_svd`` the projections train fully and the adapter
    is their change's truncated SVD; ``full_dir`` then also keeps the fully
    trained model, to measure what the truncation costs. ``device="cuda"``
    runs the same loop on a GPU (bf16 autocast for a bf16 model, fp32
    master weights), for recipe sweeps; the model comes back to the CPU
    before it is saved or merged, so what is written does not depend on it.
    ``checkpoint_dir``: a step checkpoint is saved there every
    ``checkpoint_s`` seconds and resumed from by a rerun of the same inputs
    (``agent_r.training.checkpoint``); it is removed once the model is saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_warmup(knobs)
    started = time.time()
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records, agent = training_records(data_files, knobs.general_data, knobs.eta, seed)
    data = examples(records, tokenizer, knobs.max_length)
    if not data:
        raise UsageError(f"{', '.join(data_files)}: no sample has a trained token")
    own = model_dtype(model_dir) or "float32"
    autocast = own == "bfloat16" and (device != "cpu" or cpu_bf16())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)   # fp32 master weights
    if lora is not None and not adapter_dir:
        raise UsageError("LoRA training needs the folder its adapter goes to (adapter_dir)")
    svd = lora is not None and lora.full_then_svd
    trainable = lora.freeze_all_but_targets(model) if svd else 0
    wrapped = lora.wrap(model) if lora is not None and not svd else None
    steps = plan_steps(data, knobs, seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    checkpoint = None
    if checkpoint_dir:
        lora_settings = lora_record(lora) if lora is not None else None
        key = inputs_key(model_dir, list(data_files), {**asdict(knobs), "seed": seed, "lora": lora_settings})
        checkpoint = StepCheckpoint(checkpoint_dir, key, checkpoint_s, adapter=lora is not None,
                                    here={"machine": machine(), "device": device,
                                          "precision": "bf16 autocast, fp32 weights" if autocast else "fp32"})
    losses = fit(model, steps, knobs, pad, bf16_autocast=autocast, checkpoint=checkpoint)
    model.to("cpu").eval()
    saved = own if own in ("bfloat16", "float16") else None   # a half-precision model stays one
    extra: dict = {}
    if lora is not None:
        record = {**lora_record(lora), "base": str(model_dir), "data_files": [str(f) for f in data_files]}
        if svd:
            if full_dir:
                save_model(model, Path(model_dir), Path(full_dir))
            wrapped, kept = lora.from_delta(model_dir, model)
            record["svd_energy_kept"] = extra["svd_energy_kept"] = round(kept, 4)
        else:
            trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        save_merged(wrapped, model_dir, Path(adapter_dir), Path(out_dir), record)
        extra.update({"adapter": str(adapter_dir), "trainable_parameters": trainable})
    else:
        save_model(model.to(getattr(torch, saved)) if saved else model, Path(model_dir), Path(out_dir),
                   dtype_name=saved)
    if checkpoint:
        checkpoint.remove()
        if checkpoint.resumed_from:
            extra["resumed_from_step"] = checkpoint.resumed_from
            extra["segments"] = checkpoint.segments(len(steps))
    tenth = max(1, len(losses) // 10)
    stats = {"trainer": "cpu", "agent_samples": agent, "general_samples": len(records) - agent,
             "samples": len(data), "steps": len(steps), "tokens": sum(len(ex.ids) for ex in data) * knobs.epochs,
             "first_loss": round(sum(losses[:tenth]) / tenth, 4), "last_loss": round(sum(losses[-tenth:]) / tenth, 4),
             "losses": [round(x, 4) for x in losses],
             "device": device, "precision": precision_of(extra.get("segments"), autocast), "saved_dtype": saved or "float32",
             "seconds": round(time.time() - started, 1), "config": {**asdict(knobs), "seed": seed}, **extra}
    log.info("fine-tuned %s on %d samples: %d steps, loss %.3f -> %.3f", model_dir, len(data), len(steps),
             stats["first_loss"], stats["last_loss"])
    return stats
