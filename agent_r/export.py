"""Training files from path_collection.py's JSONL: XTuner SFT and DPO pairs.

``path_collection.py export --format xtuner|dpo --input FILE... --output FILE``

* xtuner: a JSON list of ``{"messages": [...]}`` for XTuner's ``openai_map_fn``.
  Every assistant message carries an explicit boolean ``loss``; the reference's
  converter dropped these flags and so trained on the bad prefix.
* dpo: the high and low path of each revision row share a prefix (the prompt)
  and then part. Layouts: ``eto`` (ETO/FastChat ``from``/``value`` turns): the
  high path's whole continuation is chosen, the low path's rejected, with the
  observations between turns (ETO's trainer masks them); ``trl`` (TRL's
  conversational ``prompt``/``chosen``/``rejected`` message lists): one step,
  the two paths' first differing assistant turns, because TRL's DPOTrainer
  puts the preference on every completion token and would otherwise reward
  and penalise observation text the policy never writes.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from agent_r.conversation import HEAD_LEN, parse_action
from agent_r.envs import ENVS, get_env
from agent_r.io import atomic_write_json
from agent_r.knobs import CleanPaths, RefusalMask
from agent_r.llm.chat import ChatFormat
from agent_r.settings import UsageError, parse, setting
from agent_r.training.settings import DEFAULT_MAX_LENGTH, SequenceLength  # noqa: F401 - re-exported

ETO_ROLES = {"user": "human", "assistant": "gpt"}


def read_rows(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """(revision rows, good rows) from path_collection JSONL files. A row with
    ``high_log`` is a revision pair; one with only ``revise_log`` a good path.
    Each row gains ``env``: the environment its file's name says (``env_of``)."""
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
                row["env"] = env_of(path)
                (revisions if "high_log" in row else goods).append(row)
    return revisions, goods


def env_of(path: str) -> str | None:
    """The environment whose rows a path_collection file holds: it names its
    files <TASK>_centric.jsonl and <TASK>_good.jsonl (None: another name)."""
    task = Path(path).name.split("_")[0]
    return task if task in ENVS else None


def _trained(message: dict) -> bool:
    loss = message.get("loss", True)
    return loss.strip().lower() == "true" if isinstance(loss, str) else bool(loss)


def refused_turns(rows: list[dict], mask: bool) -> tuple[int, int]:
    """(trained turns, trained turns the environment refused) of the rows'
    ``revise_log`` (``env``: read_rows's). A path that ends well may still hold turns the
    environment refused (an unknown command, a craft without its
    ingredients: the step changed nothing), and a good path or a revision
    sample trains them like any other turn. With ``mask`` they are kept as
    history and not trained (their ``loss`` set false). Rows of an
    environment without a refusal pattern count none."""
    trained = refused = 0
    for row in rows:
        spec = get_env(row["env"]) if row.get("env") else None
        log = row["revise_log"]
        for turn, reply in zip(log, log[1:] + [None]):
            if turn["role"] != "assistant" or not _trained(turn):
                continue
            trained += 1
            if spec is not None and reply is not None and reply["role"] == "user" and spec.refused(reply["content"]):
                refused += 1
                if mask:
                    turn["loss"] = False
    return trained, refused


def repeated_accepted_turns(rows: list[dict]) -> int:
    """Trained turns of the rows' ``revise_log`` that repeat the action just
    before them, which the environment had accepted (``get 4 oak log`` after
    ``Got 4 oak log``). Searched paths hold such repeats, and a model trained
    on them repeats an action that worked instead of moving on: masking the
    refused turns leaves these trained, so they become a larger share of what
    follows an accepted step."""
    repeats = 0
    for row in rows:
        spec = get_env(row["env"]) if row.get("env") else None
        log = row["revise_log"]
        last_accepted = None   # the previous turn's action where the environment accepted it
        for turn, reply in zip(log, log[1:] + [None]):
            if turn["role"] != "assistant":
                continue
            action = " ".join(parse_action(turn["content"]).lower().split())
            repeats += _trained(turn) and action == last_accepted
            accepted = (reply is not None and reply["role"] == "user"
                        and not (spec is not None and spec.refused(reply["content"])))
            last_accepted = action if accepted else None
    return repeats


def xtuner_messages(messages: list[dict]) -> list[dict]:
    """role/content only, plus an explicit boolean ``loss`` on every assistant
    message (absent means trained, as openai_map_fn reads it). Contents are
    stripped, as the conversation stores them now (older trees kept
    "Inventory: "): a Llama-3 template trims message text and XTuner's
    templates do not, so only stripped text trains the same everywhere."""
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m["content"].strip()}
        if m["role"] == "assistant":
            msg["loss"] = _trained(m)
        out.append(msg)
    return out


def xtuner_samples(revisions: list[dict], goods: list[dict], good_ratio: float, seed: int) -> list[dict]:
    """Revision samples plus round(good_ratio x their number) good samples (a
    seeded choice; all of them when good_ratio < 0 or there are no revision
    samples), shuffled with the same seed."""
    rng = random.Random(seed)
    samples = [{"messages": xtuner_messages(r["revise_log"])} for r in chosen_rows(revisions, goods, good_ratio, rng)]
    rng.shuffle(samples)
    return samples


def chosen_rows(revisions: list[dict], goods: list[dict], good_ratio: float, rng: random.Random) -> list[dict]:
    """The rows ``xtuner_samples`` exports (its first use of ``rng``)."""
    n_good = len(goods) if good_ratio < 0 or not revisions else min(len(goods), round(good_ratio * len(revisions)))
    return revisions + [goods[i] for i in sorted(rng.sample(range(len(goods)), n_good))]


# ---- training length: what the trainer will see ----------------------------
# XTuner cuts a tokenized sample at max_length from the END, which is exactly
# the trained part of a revision sample (the revision turn and the good path),
# and then silently drops samples left without labels. So the export counts
# tokens the way every trainer encodes them (the model's own chat format,
# agent_r.llm.chat.ChatFormat) and fits long samples itself;
# tests/export/test_length.py checks the counts against XTuner's own code.

def load_length_counter(tokenizer_dir: str) -> Callable[[list[dict]], int]:
    """Tokens of one ``{"messages"}`` sample as the trainers encode it."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    except (OSError, ValueError) as exc:
        why = (str(exc).splitlines() or [""])[0]
        raise UsageError(f"--tokenizer {tokenizer_dir}: cannot load a tokenizer ({type(exc).__name__}: {why}); "
                         "pass the model directory you train") from None
    return ChatFormat(tokenizer).length


def shorten_history(messages: list[dict], max_length: int, count: Callable[[list[dict]], int]
                    ) -> tuple[list[dict] | None, int]:
    """``messages`` within ``max_length`` tokens with every trained token kept:
    drop the oldest untrained (assistant ``loss`` false, observation) pairs
    after the head, as the search's prompt truncation drops the oldest pairs.
    Returns (messages, pairs dropped), or (None, pairs) when the rest is still
    too long: the sample must go, since XTuner would cut its trained end."""
    dropped = 0
    while count(messages) > max_length:
        pair = messages[HEAD_LEN:HEAD_LEN + 2]
        if len(pair) < 2 or pair[0]["role"] != "assistant" or pair[0].get("loss", True) or pair[1]["role"] != "user":
            return None, dropped
        messages = messages[:HEAD_LEN] + messages[HEAD_LEN + 2:]
        dropped += 1
    return messages, dropped


@dataclass
class LengthReport:
    """How the samples fared against MAX_LENGTH; printed by the export."""

    max_length: int
    samples: int = 0
    over: int = 0               # longer than max_length as collected
    shortened: int = 0          # fitted by dropping untrained history
    pairs_dropped: int = 0      # (turn, observation) pairs removed from those
    dropped: int = 0            # left out: their trained part alone is longer
    longest: int = 0            # tokens of the longest sample as collected

    def line(self) -> str:
        if not self.over:
            return (f"token lengths: all {self.samples} samples fit MAX_LENGTH={self.max_length} "
                    f"(longest {self.longest})")
        return (f"token lengths: {self.over} of {self.samples} samples were over MAX_LENGTH={self.max_length} "
                f"(longest {self.longest}): {self.shortened} shortened by dropping {self.pairs_dropped} untrained "
                f"history turns, {self.dropped} left out (their trained part alone is longer)")


def fit_samples(samples: list[dict], max_length: int, count: Callable[[list[dict]], int]
                ) -> tuple[list[dict], LengthReport]:
    """Every sample within ``max_length`` tokens, shortened from its untrained
    history or left out (counted); nothing trained is ever cut."""
    report, kept = LengthReport(max_length, samples=len(samples)), []
    for sample in samples:
        n = count(sample["messages"])
        report.longest = max(report.longest, n)
        if n <= max_length:
            kept.append(sample)
            continue
        report.over += 1
        fitted, pairs = shorten_history(sample["messages"], max_length, count)
        if fitted is None:
            report.dropped += 1
        else:
            report.shortened += 1
            report.pairs_dropped += pairs
            kept.append({**sample, "messages": fitted})
    return kept, report


def xtuner_export(revisions: list[dict], goods: list[dict], settings: ExportSettings
                  ) -> tuple[list[dict], str, str]:
    """(samples, what they are, how their token lengths fared)."""
    samples = xtuner_samples(revisions, goods, settings.good_ratio, settings.seed)
    n_good = len(samples) - len(revisions)
    if not settings.tokenizer:
        return (samples, f"{len(samples)} samples ({len(revisions)} revision + {n_good} good)",
                f"token lengths not checked: pass --tokenizer MODEL_DIR (XTuner cuts samples over "
                f"MAX_LENGTH={settings.max_length} from their trained end)")
    fitted, report = fit_samples(samples, settings.max_length, load_length_counter(settings.tokenizer))
    if samples and not fitted:
        raise UsageError(f"all {len(samples)} samples are longer than MAX_LENGTH={settings.max_length} tokens even "
                         "without their untrained history: raise --max_length (and the training MAX_LENGTH)")
    left_out = f", {report.dropped} too long left out" if report.dropped else ""
    return fitted, f"{len(fitted)} samples ({len(revisions)} revision + {n_good} good{left_out})", report.line()


def _shared_turns(high: list[dict], low: list[dict]) -> int:
    """Messages of the common prefix after the head, in whole (turn, observation) steps."""
    i = HEAD_LEN
    while i + 1 < min(len(high), len(low)) and high[i]["content"] == low[i]["content"] \
            and high[i + 1]["content"] == low[i + 1]["content"]:
        i += 2
    return i


def _plain(messages: list[dict]) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _trim(messages: list[dict]) -> list[dict]:
    """Continuations end with the model's last turn (its observation is not part of the answer)."""
    out = _plain(messages)
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out


def trl_step_pair(high: list[dict], low: list[dict]) -> dict | None:
    """TRL's DPOTrainer scores every completion token, so a completion must
    hold only model text. The pair is the step where the two paths part: the
    shared history (observations included) is the prompt, the high path's
    next assistant turn is chosen and the low path's rejected. None when the
    paths share no whole-step prefix up to a differing turn."""
    cut = _shared_turns(high, low)
    if cut >= min(len(high), len(low)) or high[cut]["role"] != "assistant" or low[cut]["role"] != "assistant" \
            or high[cut]["content"] == low[cut]["content"]:
        return None
    return {"prompt": _plain(high[:cut]), "chosen": _plain([high[cut]]), "rejected": _plain([low[cut]])}


def eto_pair(row: dict, k: int) -> dict | None:
    """ETO's layout: whole continuations after the shared prefix, observations
    included (ETO's trainer masks the "human" turns)."""
    high, low = row["high_log"], row["low_log"]
    cut = _shared_turns(high, low)
    chosen, rejected = _trim(high[cut:]), _trim(low[cut:])
    if not chosen or not rejected:
        return None
    eto = lambda msgs: [{"from": ETO_ROLES[m["role"]], "value": m["content"]}  # noqa: E731
                        for m in msgs if m["role"] != "system"]
    return {"id": f"{row['task_num']}_{k}", "prompt": eto(_plain(high[:cut])), "chosen": eto(chosen),
            "rejected": eto(rejected)}


def dpo_pairs(revisions: list[dict], layout: str) -> list[dict]:
    """One preference pair per revision row. ``trl``: step-level pairs,
    identical ones (pairs of one tree that part at the same node) kept once;
    ``eto``: trajectory-level pairs, ids ``<task>_<k>``."""
    out, seen, per_task = [], set(), {}
    for row in revisions:
        if layout == "trl":
            pair = trl_step_pair(row["high_log"], row["low_log"])
            key = json.dumps(pair, sort_keys=True)
            if pair is not None and key not in seen:
                seen.add(key)
                out.append(pair)
            continue
        k = per_task.get(row["task_num"], 0)
        pair = eto_pair(row, k)
        if pair is not None:
            per_task[row["task_num"]] = k + 1
            out.append(pair)
    return out


@dataclass
class ExportSettings(SequenceLength, RefusalMask, CleanPaths):
    """Every setting of ``path_collection.py export`` (flags; MAX_LENGTH, declared with the training knobs, also
    from the environment, where the trainers read it)."""

    format: str | None = setting(None, choices=("xtuner", "dpo"), help="the training file kind: xtuner or dpo "
                                 "(required)")
    input: list[str] | None = setting(None, help="the path_collection JSONL files to read, centric and/or good "
                                      "(required)")
    output: str | None = setting(None, help="the JSON file to write, a list (required)")
    good_ratio: float = setting(1.0, help="xtuner: good samples per revision sample, -1 = all good samples "
                                "(default 1.0)")
    layout: str = setting("eto", choices=("eto", "trl"), help="dpo: the record layout, eto or trl (default eto)")
    seed: int = setting(0, help="the seed of the good-sample choice and the shuffle (default 0)")
    tokenizer: str | None = setting(None, help="xtuner: the model directory whose tokenizer counts each sample's "
                                    "tokens as the trainers encode them (its own chat format); samples over --max_length are "
                                    "shortened from their untrained history or left out, and counted (default: "
                                    "no length check)")
    env_server_base: str | None = setting(None, help="--clean_paths: the env server that replays the rows, or "
                                          "task=url pairs, comma-separated (default: each task's local server)")

    def finish(self) -> None:
        missing = [f"--{name}" for name in ("format", "input", "output") if not getattr(self, name)]
        if missing:
            raise UsageError(f"path_collection.py export needs {', '.join(missing)} (see --help)")


def clean_report_file(output: str | Path) -> Path:
    """Beside an export made with --clean_paths: what cleaning did (agent_r.clean.CleanReport)."""
    output = Path(output)
    return output.with_name(f"{output.stem}.clean.json")


def write_export(settings: ExportSettings) -> str:
    """Write the training file ``settings`` describe; returns the line saying what was written."""
    revisions, goods = read_rows(settings.input)
    note = ""
    if settings.clean_paths and settings.format == "xtuner":
        from agent_r import clean

        cleaned, report = clean.clean_rows(revisions + goods, clean.servers(settings.env_server_base))
        revisions, goods = [r for r in cleaned if "high_log" in r], [r for r in cleaned if "high_log" not in r]
        atomic_write_json(clean_report_file(settings.output), report.as_dict())
        note = report.line()
    if settings.format == "xtuner":
        rows = chosen_rows(revisions, goods, settings.good_ratio, random.Random(settings.seed))
        trained, refused = refused_turns(rows, settings.mask_refused)
        repeats = repeated_accepted_turns(rows)
        still_trained = trained - refused if settings.mask_refused else trained
        samples, what, written = xtuner_export(revisions, goods, settings)
        note = "\n".join(filter(None, [note, written]))
        if refused:
            note = "\n".join(filter(None, [note, (
                f"{refused} of the samples' {trained} trained turns got a refusal from the environment: "
                + ("not trained (--mask_refused)" if settings.mask_refused else
                   "trained as the paper trains them (--mask_refused 1 keeps them as history only)"))]))
        if repeats:
            note = "\n".join(filter(None, [note, (
                f"{repeats} of the {still_trained} trained turns repeat the action the "
                "environment had just accepted (a model learns them as a loop)")]))
    else:
        if not revisions:
            raise UsageError("dpo export needs revision rows (a {TASK}_centric.jsonl from path_collection.py)")
        samples = dpo_pairs(revisions, settings.layout)
        what = f"{len(samples)} preference pairs ({settings.layout} layout) from {len(revisions)} revision rows"
    if not samples:
        raise UsageError(f"nothing to export from {', '.join(settings.input)}: the inputs have no usable rows")
    atomic_write_json(settings.output, samples, indent=None)
    return f"wrote {what} to {settings.output}" + (f"\n{note}" if note else "")


def main(argv: list[str] | None = None) -> int:
    """``path_collection.py export ...``: parse, write, print what was written."""
    settings = parse(ExportSettings, argv, description=__doc__, prog="path_collection.py export")
    print(write_export(settings))
    return 0
