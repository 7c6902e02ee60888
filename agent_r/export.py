"""Training files from path_collection.py's JSONL: XTuner SFT and DPO pairs.

``path_collection.py export --format xtuner|dpo --input FILE... --output FILE``

* xtuner: a JSON list of ``{"messages": [...]}`` for XTuner's ``openai_map_fn``.
  Every assistant message carries an explicit boolean ``loss``; the reference's
  converter dropped these flags and so trained on the bad prefix.
* dpo: the high and low path of each revision row share a prefix (the prompt);
  the high path's continuation is chosen, the low path's rejected. Layouts:
  ``eto`` (ETO/FastChat ``from``/``value`` turns) or ``trl`` (TRL's
  conversational ``prompt``/``chosen``/``rejected`` message lists).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from agent_r.settings import UsageError
from agent_r.io import atomic_write_json

ETO_ROLES = {"user": "human", "assistant": "gpt"}


def read_rows(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """(revision rows, good rows) from path_collection JSONL files. A row with
    ``high_log`` is a revision pair; one with only ``revise_log`` a good path."""
    revisions, goods = [], []
    for path in paths:
        if not Path(path).is_file():
            raise UsageError(f"export input {path} does not exist: run path_collection.py first")
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{n}: not valid JSON ({exc}); rerun path_collection.py") from None
                if not isinstance(row, dict) or not isinstance(row.get("revise_log"), list):
                    raise UsageError(f"{path}:{n}: expected a path_collection row with a 'revise_log' list")
                if "high_log" in row and not (isinstance(row["high_log"], list) and isinstance(row.get("low_log"), list)):
                    raise UsageError(f"{path}:{n}: 'high_log' and 'low_log' must be message lists")
                (revisions if "high_log" in row else goods).append(row)
    return revisions, goods


def xtuner_messages(messages: list[dict]) -> list[dict]:
    """role/content only, plus an explicit boolean ``loss`` on every assistant
    message (absent means trained, as openai_map_fn reads it)."""
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m["content"]}
        if m["role"] == "assistant":
            loss = m.get("loss", True)
            msg["loss"] = loss.strip().lower() == "true" if isinstance(loss, str) else bool(loss)
        out.append(msg)
    return out


def xtuner_samples(revisions: list[dict], goods: list[dict], good_ratio: float, seed: int) -> list[dict]:
    """Revision samples plus round(good_ratio x their number) good samples (a
    seeded choice; all of them when good_ratio < 0 or there are no revision
    samples), shuffled with the same seed."""
    rng = random.Random(seed)
    n_good = len(goods) if good_ratio < 0 or not revisions else min(len(goods), round(good_ratio * len(revisions)))
    chosen = [goods[i] for i in sorted(rng.sample(range(len(goods)), n_good))]
    samples = [{"messages": xtuner_messages(r["revise_log"])} for r in revisions + chosen]
    rng.shuffle(samples)
    return samples


def _shared_turns(high: list[dict], low: list[dict]) -> int:
    """Messages of the common prefix after the head, in whole (turn, observation) steps."""
    i = 4
    while i + 1 < min(len(high), len(low)) and high[i]["content"] == low[i]["content"] \
            and high[i + 1]["content"] == low[i + 1]["content"]:
        i += 2
    return i


def _trim(messages: list[dict]) -> list[dict]:
    """Continuations end with the model's last turn (its observation is not part of the answer)."""
    out = [{"role": m["role"], "content": m["content"]} for m in messages]
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out


def dpo_pairs(revisions: list[dict], layout: str) -> list[dict]:
    out, per_task = [], {}
    for row in revisions:
        high, low = row["high_log"], row["low_log"]
        cut = _shared_turns(high, low)
        prompt = [{"role": m["role"], "content": m["content"]} for m in high[:cut]]
        chosen, rejected = _trim(high[cut:]), _trim(low[cut:])
        if not chosen or not rejected:
            continue
        if layout == "trl":
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
            continue
        k = per_task[row["task_num"]] = per_task.get(row["task_num"], -1) + 1
        eto = lambda msgs: [{"from": ETO_ROLES[m["role"]], "value": m["content"]}  # noqa: E731
                            for m in msgs if m["role"] != "system"]
        out.append({"id": f"{row['task_num']}_{k}", "prompt": eto(prompt), "chosen": eto(chosen),
                    "rejected": eto(rejected)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="path_collection.py export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=("xtuner", "dpo"), required=True)
    p.add_argument("--input", nargs="+", required=True, help="path_collection JSONL files (centric and/or good)")
    p.add_argument("--output", required=True, help="JSON file to write (a list)")
    p.add_argument("--good_ratio", type=float, default=1.0,
                   help="xtuner: good samples per revision sample (default 1.0; -1 = all good samples)")
    p.add_argument("--layout", choices=("eto", "trl"), default="eto", help="dpo: record layout (default eto)")
    p.add_argument("--seed", type=int, default=0, help="seed for the good-sample choice and shuffling (default 0)")
    args = p.parse_args(argv)
    revisions, goods = read_rows(args.input)
    if args.format == "xtuner":
        samples = xtuner_samples(revisions, goods, args.good_ratio, args.seed)
        n_good = len(samples) - len(revisions)
        what = f"{len(samples)} samples ({len(revisions)} revision + {n_good} good)"
    else:
        if not revisions:
            raise UsageError("dpo export needs revision rows (a {TASK}_centric.jsonl from path_collection.py)")
        samples = dpo_pairs(revisions, args.layout)
        what = f"{len(samples)} preference pairs ({args.layout} layout) from {len(revisions)} revision rows"
    if not samples:
        raise UsageError(f"nothing to export from {', '.join(args.input)}: the inputs have no usable rows")
    atomic_write_json(args.output, samples, indent=None)
    print(f"wrote {what} to {args.output}")
    return 0
