"""Conversations and servers shared by the backend tests."""
from __future__ import annotations

from agent_r.llm import SamplingConfig
from tests.support.env_fixtures import start_server

SECRET = "sk-PLANTED-secret-4f9c2e"   # an API key that must never show up in errors, logs or manifests
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingConfig(temperature=1.0, max_new_tokens=24)  # the scripted table replies the same at any temperature
GREEDY_16 = SamplingConfig(temperature=0.0, max_new_tokens=16)
SAMPLED_16 = SamplingConfig(temperature=1.0, max_new_tokens=16)


def numbered_chat(i: int) -> list[dict]:
    """A conversation whose last user turn grows with ``i`` (so the prompts of
    a batch differ in length), with a ``loss`` key a model must never see."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Answer with Thought: ... Action: ..."},
        {"role": "assistant", "content": "Ok.", "loss": False},
        {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: craft item {i}." * (i + 1)},
    ]


def crafting_chat(goal: str = "craft stick", turns: int = 0, filler: int = 0) -> list[dict]:
    """A TextCraft-like conversation: ``filler`` words make the first user
    turn long, ``turns`` add long history turns (what truncation cuts)."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Answer with Thought: ... Action: ..."},
            {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": f"Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: {goal}."
                                        + " oak planks" * filler}]
    for t in range(turns):
        msgs += [{"role": "assistant", "content": f"Thought: step {t}.\nAction: get 1 oak log" + " log" * 40},
                 {"role": "user", "content": f"Got 1 oak log ({t})" + " oak" * 40}]
    return msgs


def fake_serve(*args: str):
    """A fake `vllm serve` process (tests.support.fake_vllm); (process, base url with /v1)."""
    proc, url = start_server("tests.support.fake_vllm", *args)
    return proc, f"{url}/v1"
