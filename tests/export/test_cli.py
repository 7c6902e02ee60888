"""`path_collection.py export` as a user runs it: XTuner and DPO files from
JSONL rows, --good_ratio good samples per revision sample (-1 all, and all
when there is no revision row), one-line exit 2 for bad input or settings
(no output written), and write_export in process."""
import json
import os
import subprocess
import sys

import pytest

from agent_r import export
from tests.support import tree_fixtures as tf
from tests.support.env_fixtures import ROOT
from tests.support.export_rows import assert_xtuner_sample_ok, good_rows, revision_rows, rows, write_jsonl


def run_export(*args):
    return subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "export", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k not in ("TASK", "ALPHA", "BETA")})


def test_export_command_line(tmp_path):
    cen = write_jsonl(tmp_path / "textcraft_centric.jsonl", revision_rows(tf.tree_split_at_root(), {}))
    good = write_jsonl(tmp_path / "textcraft_good.jsonl", good_rows(tf.tree_one_leaf()))
    r = run_export("--format", "xtuner", "--input", cen, good, "--output", tmp_path / "train.json")
    assert r.returncode == 0, r.stderr
    assert "wrote 2 samples (1 revision + 1 good)" in r.stdout
    samples = json.loads((tmp_path / "train.json").read_text())
    assert len(samples) == 2
    for s in samples:
        assert_xtuner_sample_ok(s)
    r = run_export("--format", "dpo", "--layout", "trl", "--input", cen, "--output", tmp_path / "dpo.json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads((tmp_path / "dpo.json").read_text())) == 1


@pytest.mark.parametrize("content,needle", [
    ('{"task_num": "1", "revise_log": [\n', "bad.jsonl:1: not valid JSON"),
    ('{"task_num": "1"}\n', "bad.jsonl:1: expected a path_collection row"),
])
def test_export_bad_input(tmp_path, content, needle):
    (tmp_path / "bad.jsonl").write_text(content)
    r = run_export("--format", "xtuner", "--input", tmp_path / "bad.jsonl", "--output", tmp_path / "o.json")
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    r = run_export("--format", "dpo", "--input", tmp_path / "missing.jsonl", "--output", tmp_path / "o.json")
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("args,needle", [
    (["--format", "xtuner", "--input", "a.jsonl"], "export needs --output"),
    ([], "export needs --format, --input, --output"),
    (["--format", "sft", "--input", "a.jsonl", "--output", "o.json"], "--format='sft' is not one of xtuner, dpo"),
    (["--format", "dpo", "--layout", "hf", "--input", "a.jsonl", "--output", "o.json"],
     "--layout='hf' is not one of eto, trl"),
])
def test_export_settings_errors_are_one_line(args, needle):
    r = run_export(*args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_write_export_in_process(tmp_path):
    cen = write_jsonl(tmp_path / "c.jsonl", revision_rows(tf.tree_split_at_root(), {}))
    settings = export.ExportSettings(format="dpo", input=[str(cen)], output=str(tmp_path / "d.json"), layout="trl")
    assert export.write_export(settings) == f"wrote 1 preference pairs (trl layout) from 1 revision rows to {settings.output}"
    assert set(json.loads((tmp_path / "d.json").read_text())[0]) == {"prompt", "chosen", "rejected"}


@pytest.mark.parametrize("flags,revisions,good", [
    ([], 4, 4), (["--good_ratio", "0.5"], 4, 2), (["--good_ratio", "2"], 4, 8), (["--good_ratio", "0"], 4, 0),
    (["--good_ratio", "-1"], 4, 10), (["--good_ratio", "5"], 4, 10), (["--good_ratio", "0.5"], 0, 10),
])
def test_good_ratio_sets_the_good_samples_per_revision_sample(tmp_path, flags, revisions, good):
    """4 revision rows and 10 good rows: --good_ratio R adds round(R x 4)
    good samples (default 1; at most the 10 there are), -1 adds all, and
    without revision rows every good row is a sample."""
    rev, goods = rows(revisions, 10)
    inputs = [write_jsonl(tmp_path / "good.jsonl", goods)]
    if rev:
        inputs.insert(0, write_jsonl(tmp_path / "centric.jsonl", rev))
    r = run_export("--format", "xtuner", "--input", *inputs, "--output", tmp_path / "train.json", *flags)
    assert r.returncode == 0, r.stderr
    assert f"wrote {revisions + good} samples ({revisions} revision + {good} good)" in r.stdout
    last = [s["messages"][-1]["content"] for s in json.loads((tmp_path / "train.json").read_text())]
    assert sum(c.startswith("g") for c in last) == good and sum(c.startswith("r") for c in last) == revisions
