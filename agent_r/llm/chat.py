"""How a conversation becomes a model's prompt and a reply becomes text: the
same rules for every backend, so token counts and stop strings agree."""
from __future__ import annotations

from typing import Any, Sequence


def chat_messages(messages: list[dict]) -> list[dict]:
    """Strip our extra keys (e.g. ``loss``) before a message list reaches a model."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """Text before the earliest stop string (stop strings are never returned)."""
    cut = len(text)
    for s in stop:
        i = text.find(s) if s else -1
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def chat_prompt(tokenizer: Any, messages: list[dict]) -> str:
    """The exact prompt text a chat model sees: its own chat template with the
    assistant generation prompt appended."""
    return tokenizer.apply_chat_template(chat_messages(messages), add_generation_prompt=True, tokenize=False)


def chat_token_count(tokenizer: Any, messages: list[dict]) -> int:
    """Tokens of ``chat_prompt``. The template already holds bos, so special
    tokens are not added again (that would count bos twice). verbose=False:
    counting a conversation longer than the model (to truncate it) is not the
    "indexing errors" transformers warns of."""
    return len(tokenizer(chat_prompt(tokenizer, messages), add_special_tokens=False, verbose=False)["input_ids"])


def load_tokenizer(path: str) -> Any:
    """The model's tokenizer, padding on the left (batched generation aligns
    every prompt's end)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, padding_side="left")
