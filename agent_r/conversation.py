"""The conversation layout every stage shares: search prompts, eval prompts,
revision rows and training files all use it.

index 0 system, 1 user instruction, 2 assistant "Ok.", 3 user initial
observation, then assistant turns and user observations alternating.
"""
from __future__ import annotations

import re
from typing import Callable

SYSTEM_PROMPT = "You are a helpful assistant."
ACK = "Ok."
HEAD_LEN = 4  # messages 0-3 are never truncated
TRUNCATION_MARGIN = 60  # tokens kept free below MAX_TOKEN_LENGTH

Message = dict  # {"role": str, "content": str, optional "loss": bool}

_NUMBERED_LABEL = re.compile(r"\b(Thought|Action)\s+\d+\s*:")
_ACTION_LABEL = re.compile(r"Action(?:\s+\d+)?\s*:")
_LIST_NUMBER = re.compile(r"^\s*\d+\s*[.)]\s+")


def initial_conversation(instruction: str, observation: str) -> list[Message]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction.strip()},
        {"role": "assistant", "content": ACK},
        {"role": "user", "content": observation.strip()},
    ]


def normalise_turn(turn: str) -> str:
    """`Thought 1:` / `Action 1:` become `Thought:` / `Action:` in the stored turn."""
    return _NUMBERED_LABEL.sub(lambda m: f"{m.group(1)}:", turn).strip()


def parse_action(turn: str) -> str:
    """The action of a model turn: text after the last `Action:` (or `Action N:`),
    stripped, without a leading list number; else the last non-empty line."""
    matches = list(_ACTION_LABEL.finditer(turn))
    if matches:
        action = turn[matches[-1].end():].strip()
    else:
        lines = [line.strip() for line in turn.splitlines() if line.strip()]
        action = lines[-1] if lines else ""
    return _LIST_NUMBER.sub("", action).strip()


def has_action(turn: str) -> bool:
    """Whether a model turn names its action with an ``Action:`` label."""
    return _ACTION_LABEL.search(turn) is not None


def clean_observation(observation: str) -> str:
    """Observations are stored on one line: newlines and tabs become spaces,
    and without surrounding whitespace (TextCraft's empty inventory is
    "Inventory: "), which some chat templates trim and others keep: stripped,
    every model and trainer sees the same text."""
    return observation.replace("\r", " ").replace("\n", " ").replace("\t", " ").strip()


def truncate(messages: list[Message], max_tokens: int, count_tokens: Callable[[list[Message]], int]) -> list[Message]:
    """Drop the oldest assistant/observation pairs after index 3 until the chat
    prompt fits in ``max_tokens - 60`` tokens. The newest pair always stays, so
    the model still sees its last action and the current observation.

    The result is what dropping one pair at a time would give, found by
    bisection: dropping more pairs never adds tokens, so the smallest number of
    dropped pairs that fits is a boundary. One pair at a time re-counted the
    whole chat once per dropped pair, every turn: an eval episode 100 turns
    deep spent minutes of CPU in the tokenizer."""
    budget = max_tokens - TRUNCATION_MARGIN
    head, tail = messages[:HEAD_LEN], list(messages[HEAD_LEN:])
    most = max(0, (len(tail) - 1) // 2)    # drops until at most 2 messages remain

    def fits(dropped: int) -> bool:
        return count_tokens(head + tail[2 * dropped:]) <= budget

    if most == 0 or fits(0):
        return head + tail
    low, high = 1, most                   # the answer is in [low, high]; high if nothing fits
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return head + tail[2 * low:]


def append_turn(messages: list[Message], turn: str, observation: str) -> list[Message]:
    """A new message list: ``messages`` + the (normalised) model turn + the
    (one-line) observation its action produced. The initial observation
    (message 3) is kept verbatim; step observations are cleaned."""
    return messages + [
        {"role": "assistant", "content": normalise_turn(turn)},
        {"role": "user", "content": clean_observation(observation)},
    ]
