"""Training records for both trainers: Agent-R exports plus optional general
chat data, as ``{"messages": [...]}`` rows (a ``datasets.Dataset`` for XTuner's
config, a list for the in-process trainer), so both learn from the same rows.

Runs inside the training environment too (XTuner pins transformers 4.48), so
it imports nothing but ``agent_r.settings`` and ``agent_r.io``, which are
standard-library only.

Agent data is what ``path_collection.py export --format xtuner`` writes: a JSON
list of ``{"messages": [...]}`` where every assistant message carries a boolean
``loss``. XTuner's ``openai_map_fn`` treats a missing ``loss`` as "train on
it", so a file without the flags (e.g. the reference's converter output) would
silently train on the bad prefix of every revision sample; it is rejected here.

General data (the paper mixes ShareGPT at eta = 0.2) is a JSON list (or
JSONL) of ``{"conversations": [{"from": "human"|"gpt"|"system", "value":
str}]}``, or of conversations in this project's own format, ``{"messages":
[...]}`` with the assistant turns' ``loss`` flags (a model's own training data,
e.g. scripts/make_expert_data.py's output: what a small model trained from
scratch has instead of ShareGPT; its fixed turns stay untrained); several
files comma-separated. We add ``round(eta x number of agent samples)`` general
conversations: a seeded sample without replacement, or every conversation
repeated and a seeded remainder when the files have fewer.
"""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from agent_r.settings import UsageError
from agent_r.io import read_json

log = logging.getLogger(__name__)

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}


def _load_list(path: str, what: str, fix: str) -> list:
    if not Path(path).is_file():
        raise UsageError(f"{what} file {path} does not exist: {fix}")
    try:
        rows = read_json(path)
    except ValueError as exc:
        raise UsageError(f"{exc}: {fix}") from None
    if not isinstance(rows, list):
        raise UsageError(f"{path} is not a JSON list: {fix}")
    return rows


def load_agent_samples(data_files: list[str]) -> list[dict]:
    """Agent-R export records, checked so that no loss flag can be lost."""
    fix = "pass files written by `python path_collection.py export --format xtuner`"
    samples = []
    for path in data_files:
        for n, row in enumerate(_load_list(path, "DATA_FILES", fix)):
            msgs = row.get("messages") if isinstance(row, dict) else None
            if not isinstance(msgs, list) or not msgs:
                raise UsageError(f"{path}[{n}]: expected {{\"messages\": [...]}}; {fix}")
            for m in msgs:
                if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                        or not isinstance(m.get("content"), str):
                    raise UsageError(f"{path}[{n}]: a message needs role system/user/assistant and "
                                     f"string content; {fix}")
                if m["role"] == "assistant" and not isinstance(m.get("loss"), bool):
                    raise UsageError(f"{path}[{n}]: an assistant message has no boolean 'loss' flag, so "
                                     f"XTuner would train on it; {fix}")
            samples.append({"messages": [dict(m) for m in msgs]})
    return samples


def sharegpt_to_messages(conversation: list) -> list[dict] | None:
    """ShareGPT turns -> messages with every assistant turn trained; None when
    the conversation has an unknown speaker or nothing to train on."""
    msgs = []
    for turn in conversation:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            return None
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            return None
        msg = {"role": role, "content": turn["value"]}
        if role == "assistant":
            msg["loss"] = True
        msgs.append(msg)
    return msgs if any(m["role"] == "assistant" for m in msgs) else None


def own_format_messages(messages: list) -> list[dict] | None:
    """This project's conversation (role/content messages; an assistant
    message trained unless its ``loss`` is false) -> messages with a boolean
    ``loss`` on each assistant turn; None when malformed or nothing is trained."""
    msgs = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            return None
        msg = {"role": m["role"], "content": m["content"]}
        if m["role"] == "assistant":
            msg["loss"] = m.get("loss") is not False and str(m.get("loss", True)).lower() != "false"
        msgs.append(msg)
    return msgs if any(m.get("loss") for m in msgs) else None


def _load_rows(path: str, fix: str) -> list:
    """A JSON list, or JSON Lines (one object a line) when the file is not one."""
    if not Path(path).is_file():
        raise UsageError(f"GENERAL_DATA file {path} does not exist: {fix}")
    text = Path(path).read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except ValueError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise UsageError(f"GENERAL_DATA {path} is neither JSON nor JSON Lines ({exc}): {fix}") from None
    if not isinstance(rows, list):
        raise UsageError(f"{path} is not a JSON list: {fix}")
    return rows


def load_general_samples(path: str) -> list[dict]:
    """The general conversations of GENERAL_DATA (one file, or several comma-separated)."""
    fix = ('give a JSON list or JSONL of {"conversations": [{"from": "human"|"gpt", "value": ...}]} (ShareGPT '
           'format) or of {"messages": [...]} (this project\'s conversations)')
    samples, skipped, total = [], 0, 0
    for one in [p.strip() for p in path.split(",") if p.strip()]:
        rows = _load_rows(one, fix)
        total += len(rows)
        for row in rows:
            msgs = None
            if isinstance(row, dict) and isinstance(row.get("conversations"), list):
                msgs = sharegpt_to_messages(row["conversations"])
            elif isinstance(row, dict) and isinstance(row.get("messages"), list):
                msgs = own_format_messages(row["messages"])
            if msgs is None:
                skipped += 1
            else:
                samples.append({"messages": msgs})
    if skipped:
        log.warning("GENERAL_DATA %s: skipped %d of %d conversations (unknown speaker, malformed, "
                    "or no assistant turn)", path, skipped, total)
    if not samples:
        raise UsageError(f"GENERAL_DATA {path} has no usable conversation: {fix}")
    return samples


def mix(agent: list[dict], general: list[dict], eta: float, seed: int) -> list[dict]:
    """Agent samples plus round(eta x len(agent)) general ones, shuffled (seeded)."""
    rng = random.Random(seed)
    want = round(eta * len(agent))
    chosen = general * (want // len(general)) if general else []
    chosen += rng.sample(general, want - len(chosen)) if general else []
    out = agent + chosen
    rng.shuffle(out)
    return out


def training_records(data_files: str | list[str], general_data: str = "", eta: float = 0.2,
                     seed: int = 0) -> tuple[list[dict], int]:
    """(the rows a trainer learns from, how many of them are agent samples):
    the export files (``data_files`` comma-separated or a list) plus general
    data at ``eta``. Both trainers call this, so they learn from the same rows."""
    files = [f.strip() for f in data_files.split(",")] if isinstance(data_files, str) else list(data_files)
    files = [f for f in files if f]
    if not files:
        raise UsageError("DATA_FILES is not set: it is the comma-separated list of JSON files from "
                         "`python path_collection.py export --format xtuner`. Set it, e.g. "
                         "`export DATA_FILES=train.json`.")
    if eta < 0:
        raise UsageError(f"ETA={eta} is negative: it is the number of general samples per agent sample.")
    agent = load_agent_samples(files)
    general = load_general_samples(general_data) if general_data and eta > 0 else []
    rows = mix(agent, general, eta, seed) if general else agent
    log.info("training records: %d agent + %d general", len(agent), len(rows) - len(agent))
    return rows, len(agent)


def load_agent_r_dataset(data_files: str | list[str], general_data: str = "", eta: float = 0.2,
                         seed: int = 0):
    """The XTuner config's dataset builder: ``training_records`` as a ``datasets.Dataset``."""
    from datasets import Dataset

    return Dataset.from_list(training_records(data_files, general_data, eta, seed)[0])
