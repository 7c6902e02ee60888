"""Tiny models of three chat-format families, built locally: Llama-3 (the
bundled models' format), ChatML (Qwen2.x, SmolLM2) and Gemma (system text
folded into the first user turn, the assistant called "model").

Each is a random tiny Llama with a byte-level BPE tokenizer trained on a few
KB of agent text, the family's special tokens and a chat template written
here in that family's layout. The tokenizer files are in the form
transformers 4.x reads too (XTuner's environment loads them). The ChatML
tokenizer declares Qwen2's class and no BOS, as Qwen2.5 does (XTuner's
encoder starts a Qwen2 sample without one).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tests.support.model_fixtures import _CORPUS, build_tiny_model

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] | trim + '\n\n' %}{% set rest = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Family:
    name: str
    end_of_turn: str              # the token that closes an assistant turn
    specials: tuple[str, ...] = ()
    bos: Optional[str] = None
    pad: str = ""
    template: str = ""
    tokenizer_class: str = "PreTrainedTokenizerFast"


FAMILIES = {
    "llama3": Family("llama3", "<|eot_id|>"),          # built by model_fixtures.build_tiny_model
    "chatml": Family("chatml", "<|im_end|>", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None,
                     "<|endoftext|>", CHATML_TEMPLATE, "Qwen2TokenizerFast"),
    "gemma": Family("gemma", "<end_of_turn>", ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
                    "<bos>", "<pad>", GEMMA_TEMPLATE),
}


def build_family_model(path: str | Path, family: str, seed: int = 0, hidden: int = 64) -> str:
    """Write a tiny random model of ``family`` with its tokenizer to ``path``."""
    if family == "llama3":
        return build_tiny_model(path, seed=seed, hidden=hidden)
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    fam = FAMILIES[family]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if fam.tokenizer_class.startswith("Qwen2"):
        # Qwen2's own split, which transformers 5 rebuilds for its class whatever tokenizer.json says
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([_CORPUS], trainer=trainers.BpeTrainer(
        vocab_size=1024, special_tokens=list(fam.specials), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path / "tokenizer.json"))
    decoder = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t in fam.specials}
    names = {"bos_token": fam.bos, "eos_token": fam.end_of_turn, "pad_token": fam.pad}
    config = {"added_tokens_decoder": decoder, **names, "chat_template": fam.template,
              "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"],
              "model_max_length": 4096, "padding_side": "left", "tokenizer_class": fam.tokenizer_class,
              "errors": "replace", "split_special_tokens": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (path / "special_tokens_map.json").write_text(json.dumps(
        {k: v for k, v in names.items() if v}, indent=2) + "\n")

    eot = tok.token_to_id(fam.end_of_turn)
    bos = tok.token_to_id(fam.bos) if fam.bos else None
    model_config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=2,
        num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, head_dim=64,
        max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=True,
        bos_token_id=bos, eos_token_id=eot, pad_token_id=tok.token_to_id(fam.pad))
    torch.manual_seed(seed)
    LlamaForCausalLM(model_config).save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.setdefault("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", cfg.get("dtype") or "float32")
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eot, "pad_token_id": model_config.pad_token_id}, indent=2))
    return str(path)
