"""Regression guard for the shipped policy models/textcraft-tiny: its files are
small, it loads with the hf backend and plays known TRAIN tasks - one- and
multi-step - to success greedily."""
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
# A train task of several steps (get, get, craft) the shipped model solves greedily.
SOLVED_MULTI_STEP = 46


@pytest.fixture(scope="module")
def backend():
    """The shipped model under hf on CPU, shared by the module."""
    b = HFBackend(str(BUNDLED_MODEL), device="cpu")
    yield b
    b.close()


def test_shipped_model_files_are_small_and_loadable():
    """The folder holds config, weights, tokenizer and README within 25 MiB; a 64-wide-head Llama."""
    files = {p.name for p in BUNDLED_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= files
    assert sum(p.stat().st_size for p in BUNDLED_MODEL.iterdir()) <= 25 * 2**20
    config = json.loads((BUNDLED_MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and config["head_dim"] == 64


def test_shipped_model_solves_known_train_tasks_greedily(backend):
    """Every turn is "Thought: ... Action: ..." and tasks 1 and 3 end with reward 1 within 10 steps."""
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


def test_shipped_model_solves_a_multi_step_train_task_greedily(backend):
    """Train task 46 (get, get, craft) ends with reward 1 after at least 3 steps."""
    assert SOLVED_MULTI_STEP in get_env("textcraft").split_indices("train")
    game = TextCraftGame(SOLVED_MULTI_STEP)
    messages = initial_conversation(load_instruction("textcraft"), game.observation)
    reward, steps = 0.0, 0
    for steps in range(1, 11):
        turn = backend.generate([GenerationRequest(messages)], SamplingConfig(temperature=0, max_new_tokens=60))[0][0]
        obs, reward, done = game.step(parse_action(turn))
        messages = append_turn(messages, turn, obs)
        if done:
            break
    assert reward == 1 and steps >= 3, [m["content"] for m in messages[4:]]
