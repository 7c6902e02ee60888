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


# --------------------------------------------------------------------------- training: a conversation cut into turns

IGNORE = -100   # the label of a token that is not trained (PyTorch's cross-entropy ignore index)


class ChatFormat:
    """How one model lays out a conversation for training, read from its own
    chat template, so every trainer teaches the format the model is prompted
    with at inference (``chat_prompt``).

    Per assistant turn: the prompt is the text between the previous turn's
    answer and the generation header, exactly as ``chat_prompt`` renders that
    history; the answer is the turn's content as the template writes it plus
    the model's own end-of-turn token (so the model learns to stop). Text the
    template puts after the end-of-turn (ChatML's newline) opens the next
    prompt and is never trained. Each piece is tokenized apart, as XTuner's
    ``encode_fn`` does; for a Llama-3 template this is token for token
    XTuner's ``llama3_chat`` encoding and for a ChatML one its ``qwen_chat``.

    As XTuner's ``openai_map_fn`` does: leading assistant messages are
    skipped, consecutive user messages are joined into one, and text after the
    last assistant message is dropped. A sample is cut at ``max_length``.
    """

    def __init__(self, tokenizer: Any):
        from agent_r.settings import UsageError

        self.tokenizer = tokenizer
        self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if not getattr(tokenizer, "chat_template", None):
            raise UsageError(f"{self.name}: the tokenizer has no chat template, so nothing says how this model "
                             "reads a conversation: train a chat (instruct) model, or put the template it should "
                             "learn in the model folder (chat_template.jinja)")
        specials = set(getattr(tokenizer, "all_special_tokens", []))
        specials |= {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
        self.special_tokens = sorted((s for s in specials if s), key=len, reverse=True)
        self._token_cache: dict[str, list[int]] = {}

    def _error(self, why: str) -> Exception:
        from agent_r.settings import UsageError

        return UsageError(f"{self.name}: {why}, so its trained turns cannot be cut apart: give the model a chat "
                          "template that renders the history unchanged and ends each assistant turn with a special "
                          "token (chat_template.jinja in the model folder)")

    def _render(self, messages: list[dict], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)

    def tokens(self, text: str) -> list[int]:
        if text not in self._token_cache:
            self._token_cache[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return self._token_cache[text]

    @staticmethod
    def normalise(messages: list[dict]) -> list[dict]:
        """XTuner's reading of a sample: leading assistant messages skipped,
        consecutive user messages joined, nothing after the last assistant."""
        from agent_r.settings import UsageError

        out: list[dict] = []
        for m in messages:
            if m["role"] not in ("system", "user", "assistant"):
                raise UsageError(f"a message has role {m['role']!r}: only system, user and assistant can be trained")
            if m["role"] == "assistant" and not any(o["role"] != "assistant" for o in out):
                continue
            if m["role"] == "user" and out and out[-1]["role"] == "user":
                out[-1] = {"role": "user", "content": out[-1]["content"] + m["content"]}
            else:
                out.append({"role": m["role"], "content": m["content"], "loss": m.get("loss", True)})
        while out and out[-1]["role"] != "assistant":
            out.pop()
        return out

    def _answer_end(self, region: str, content: str) -> int:
        """Length of the answer in ``region`` (text the template adds for one
        assistant message): the content as written, then one special token."""
        for text in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
            if region.startswith(text):
                rest = region[len(text):]
                end = next((s for s in self.special_tokens if rest.startswith(s)), None)
                if end is not None:
                    return len(text) + len(end)
        raise self._error(f"its chat template does not write an assistant message as its content followed by an "
                          f"end-of-turn special token (it wrote {region[:80]!r})")

    def turns(self, messages: list[dict]) -> tuple[list[tuple[str, str, bool]], str]:
        """(prompt text, answer text, trained?) per assistant turn, and the
        untrained text the template writes after the last answer."""
        msgs = self.normalise(messages)
        plain = chat_messages(msgs)
        turns, done = [], ""
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = self._render(plain[:i], True)
            full = self._render(plain[:i + 1], False)
            if not prompt.startswith(done) or not full.startswith(prompt):
                raise self._error(f"its chat template renders the first {i} messages as text that the longer "
                                  "conversation does not start with")
            answer = full[len(prompt):len(prompt) + self._answer_end(full[len(prompt):], m["content"])]
            turns.append((prompt[len(done):], answer, str(m["loss"]).lower() == "true"))
            done = prompt + answer
        tail = full[len(done):] if turns else ""
        return turns, tail

    @property
    def end_of_turn(self) -> str:
        """The special token that closes an assistant turn in this format
        (Llama-3's <|eot_id|>, ChatML's <|im_end|>, Gemma's <end_of_turn>)."""
        turns, _ = self.turns([{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}])
        return turns[0][1][len("Hello."):]

    def encode(self, messages: list[dict], max_length: int) -> tuple[list[int], list[int]]:
        """(input_ids, labels) of one sample: answers of trained turns carry
        their own ids as labels, everything else -100; cut at ``max_length``."""
        turns, tail = self.turns(messages)
        ids: list[int] = []
        labels: list[int] = []
        for prompt, answer, trained in turns:
            p, a = self.tokens(prompt), self.tokens(answer)
            ids += p + a
            labels += [IGNORE] * len(p) + (a if trained else [IGNORE] * len(a))
        t = self.tokens(tail) if tail else []
        ids, labels = ids + t, labels + [IGNORE] * len(t)
        return ids[:max_length], labels[:max_length]

    def length(self, messages: list[dict]) -> int:
        """Tokens of the encoded sample, uncut (the export fits samples with it)."""
        return len(self.encode(messages, 10**9)[0])

