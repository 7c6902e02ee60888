"""Training length: XTuner cuts a sample at MAX_LENGTH from its end - the
trained part of a revision sample - and drops samples left without labels.
The xtuner export counts tokens exactly as XTuner encodes them and fits long
samples by dropping untrained history, or leaves them out, counted; a
trained token is never cut. The counts are checked against XTuner's own
map/template/encode functions in the training env."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r import export
from agent_r.conversation import HEAD_LEN, initial_conversation
from agent_r.training.settings import xtuner_template_for
from tests.support.env_fixtures import ROOT


TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
TRAIN_SUPPORT = ROOT / "tests" / "training" / "support"   # torchvision stub for XTuner on CPU


def revision_sample(bad: int, good: int, words: int = 20) -> dict:
    """head + ``bad`` untrained (turn, observation) pairs + a trained revision
    turn + ``good`` trained pairs, in the export's message form."""
    # instructions are stripped (agentenv_client.base.load_instruction): a Llama-3 template trims
    # message text, XTuner's llama3_chat does not, so surrounding whitespace would count differently
    msgs = initial_conversation(("Craft things. " * 5).strip(), "Goal: craft a stick. Crafting commands: ...")
    msgs[2]["loss"] = False
    text = lambda tag, i: " ".join(f"{tag}{i}w{k}" for k in range(words))  # noqa: E731
    for i in range(bad):
        msgs += [{"role": "assistant", "content": f"Thought: {text('bad', i)}\nAction: get 1 x", "loss": False},
                 {"role": "user", "content": f"Observation: {text('obs', i)}"}]
    msgs += [{"role": "assistant", "content": "Thought: I went wrong.\nAction: wait", "loss": True},
             {"role": "user", "content": "Observation: Nothing happened."}]
    for i in range(good):
        msgs += [{"role": "assistant", "content": f"Thought: {text('good', i)}\nAction: craft 1 y", "loss": True},
                 {"role": "user", "content": f"Observation: {text('gobs', i)}"}]
    return {"messages": msgs}


def words(messages: list[dict]) -> int:
    """A stand-in length: whitespace-separated words."""
    return sum(len(m["content"].split()) for m in messages)


def trained(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant" and m.get("loss")]


def test_short_samples_are_left_alone():
    sample = revision_sample(bad=2, good=1)
    out, dropped = export.shorten_history(sample["messages"], 10_000, words)
    assert out == sample["messages"] and dropped == 0


def test_long_samples_lose_their_oldest_untrained_pairs_only():
    sample = revision_sample(bad=4, good=2)
    full, tail = words(sample["messages"]), words(sample["messages"][HEAD_LEN + 8:])
    per_pair = words(sample["messages"][HEAD_LEN:HEAD_LEN + 2])
    out, dropped = export.shorten_history(sample["messages"], full - per_pair - 1, words)   # needs 2 pairs gone
    assert dropped == 2 and words(out) <= full - per_pair - 1
    assert out[:HEAD_LEN] == sample["messages"][:HEAD_LEN]                 # the head stays
    assert out[HEAD_LEN:] == sample["messages"][HEAD_LEN + 4:]             # the two OLDEST pairs went
    assert trained(out) == trained(sample["messages"])                     # nothing trained touched
    assert [m["role"] for m in out[HEAD_LEN:]] == ["assistant", "user"] * ((len(out) - HEAD_LEN) // 2)
    # all untrained history gone and still too long: the sample cannot be fitted
    out, dropped = export.shorten_history(sample["messages"], tail + words(sample["messages"][:HEAD_LEN]) - 1, words)
    assert out is None and dropped == 4


def test_fit_samples_counts_what_it_did():
    samples = [revision_sample(bad=0, good=1), revision_sample(bad=3, good=1), revision_sample(bad=1, good=6)]
    lengths = [words(s["messages"]) for s in samples]
    limit = lengths[0] + 5
    kept, report = export.fit_samples(samples, limit, words)
    assert (report.samples, report.over, report.shortened, report.dropped) == (3, 2, 1, 1)
    assert report.pairs_dropped == 3 and report.longest == max(lengths)
    assert kept[0] == samples[0] and len(kept) == 2 and all(words(s["messages"]) <= limit for s in kept)
    assert trained(kept[1]["messages"]) == trained(samples[1]["messages"])
    assert "2 of 3 samples were over MAX_LENGTH=" in report.line() and "1 left out" in report.line()
    assert "all 1 samples fit" in export.fit_samples(samples[:1], limit, words)[1].line()


XTUNER_PROBE = r"""
import json, sys
from xtuner.dataset.map_fns import openai_map_fn, template_map_fn
from xtuner.dataset.utils import encode_fn
from xtuner.utils import PROMPT_TEMPLATE
from transformers import AutoTokenizer
tok_dir, template, max_length, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
tok = AutoTokenizer.from_pretrained(tok_dir)
t = PROMPT_TEMPLATE[template]
out = {}
for data in files:
    out[data] = {"full": [], "cut": []}
    for sample in json.load(open(data)):
        conv = template_map_fn(openai_map_fn(dict(sample)), template=t)
        full = encode_fn(dict(conv), tok, max_length=10**9)
        cut = encode_fn(dict(conv), tok, max_length=max_length)
        out[data]["full"].append([len(full["input_ids"]), sum(l >= 0 for l in full["labels"])])
        out[data]["cut"].append([len(cut["input_ids"]), sum(l >= 0 for l in cut["labels"])])
print(json.dumps(out))
"""


def xtuner_encode(tokenizer_dir: str, max_length: int, *sample_files: Path) -> dict:
    """XTuner's own encoding of each file's samples: [tokens, trained tokens]
    per sample, uncut ("full") and cut at ``max_length`` ("cut")."""
    if not TRAIN_PY.exists():
        pytest.skip("the training environment .venv-train is missing: run `make setup-train`")
    env = {**os.environ, "PYTHONPATH": str(TRAIN_SUPPORT), "OMP_NUM_THREADS": "1"}
    template = xtuner_template_for(tokenizer_dir)     # the one XTuner's config picks for this model
    r = subprocess.run([str(TRAIN_PY), "-c", XTUNER_PROBE, tokenizer_dir, template, str(max_length),
                        *map(str, sample_files)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def write_rows(path: Path, samples: list[dict]) -> Path:
    """path_collection JSONL rows (revision rows carry high/low logs)."""
    rows = [{"task_num": i, "revise_log": s["messages"], "high_log": [], "low_log": []}
            for i, s in enumerate(samples)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_export_fits_samples_so_xtuner_cuts_nothing(tmp_path, tiny_model_dir):
    samples = [revision_sample(0, 1), revision_sample(3, 1), revision_sample(6, 2), revision_sample(0, 12)]
    count = export.load_length_counter(tiny_model_dir)
    lengths = [count(s["messages"]) for s in samples]
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(samples))
    limit = (lengths[0] + lengths[1]) // 2 + 40            # sample 0 fits, 1 and 2 must shrink, 3 cannot
    r = subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "export", "--format", "xtuner",
                        "--input", str(write_rows(tmp_path / "rows.jsonl", samples)), "--output",
                        str(tmp_path / "train.json"), "--tokenizer", tiny_model_dir, "--max_length", str(limit)],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wrote 3 samples (4 revision + 0 good, 1 too long left out)" in r.stdout
    assert f"3 of 4 samples were over MAX_LENGTH={limit}" in r.stdout and "2 shortened" in r.stdout

    fitted = json.loads((tmp_path / "train.json").read_text())

    xt = xtuner_encode(tiny_model_dir, limit, raw, tmp_path / "train.json")
    before, after = xt[str(raw)], xt[str(tmp_path / "train.json")]
    assert xtuner_template_for(tiny_model_dir) == "llama3_chat"
    assert [n for n, _ in before["full"]] == lengths                 # our count is XTuner's, token for token
    assert any(cut[1] < full[1] for cut, full in zip(before["cut"], before["full"]))  # XTuner alone cuts training
    assert after["cut"] == after["full"]                             # after the export: XTuner cuts nothing
    assert all(n <= limit for n, _ in after["full"])
    by_tail = {json.dumps(trained(s["messages"])) for s in samples[:3]}
    assert {json.dumps(trained(s["messages"])) for s in fitted} == by_tail   # every trained turn kept, whole


def test_export_without_tokenizer_says_lengths_were_not_checked(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [revision_sample(1, 1)])
    settings = export.ExportSettings(format="xtuner", input=[str(rows)], output=str(tmp_path / "t.json"))
    line = export.write_export(settings)
    assert line.splitlines() == [f"wrote 1 samples (1 revision + 0 good) to {settings.output}",
                                 "token lengths not checked: pass --tokenizer MODEL_DIR (XTuner cuts samples over "
                                 f"MAX_LENGTH={export.DEFAULT_MAX_LENGTH} from their trained end)"]


def test_bad_tokenizer_is_a_usage_error(tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", [revision_sample(1, 1)])
    settings = export.ExportSettings(format="xtuner", input=[str(rows)], output=str(tmp_path / "t.json"),
                                     tokenizer=str(tmp_path / "nowhere"))
    with pytest.raises(export.UsageError, match="--tokenizer .*nowhere: cannot load a tokenizer"):
        export.write_export(settings)
