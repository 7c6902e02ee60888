"""Regression guard for the shipped policy models/textcraft-tiny: it loads with
the hf backend and plays known TRAIN tasks to success greedily."""
import json
import re

import pytest

from agent_r.conversation import append_turn, initial_conversation, parse_action
from agent_r.llm import BUNDLED_MODEL, GenerationRequest, HFBackend, SamplingConfig
from agent_r.envs import get_env
from agentenv_servers.textcraft_env import TextCraftGame
from agentenv_client import load_instruction

# Train tasks the shipped model solves greedily (checked when it was trained).
SOLVED_TRAIN_TASKS = [1, 3]


@pytest.fixture(scope="module")
def backend():
    b = HFBackend(str(BUNDLED_MODEL), device="cpu")
    yield b
    b.close()


def test_shipped_model_files_are_small_and_loadable():
    files = {p.name for p in BUNDLED_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= files
    assert sum(p.stat().st_size for p in BUNDLED_MODEL.iterdir()) <= 25 * 2**20
    config = json.loads((BUNDLED_MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and config["head_dim"] == 64


def test_shipped_model_solves_known_train_tasks_greedily(backend):
    train = set(get_env("textcraft").split_indices("train"))
    instruction = load_instruction("textcraft")
    for idx in SOLVED_TRAIN_TASKS:
        assert idx in train
        game = TextCraftGame(idx)
        messages = initial_conversation(instruction, game.observation)
        reward = 0.0
        for _ in range(10):
            turn = backend.generate([GenerationRequest(messages)], SamplingConfig(temperature=0, max_new_tokens=60))[0][0]
            assert turn.startswith("Thought: ") and "\nAction: " in turn, turn
            action = re.sub(r"\s+", " ", re.sub(r"[^A-Za-z0-9, ]", "", parse_action(turn))).strip()
            obs, reward, done = game.step(action)
            messages = append_turn(messages, turn, obs)
            if done:
                break
        assert reward == 1, (idx, [m["content"] for m in messages[4:]])
