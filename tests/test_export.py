"""Training exports: XTuner messages with explicit loss flags, DPO pairs (ETO and
TRL layouts), and the `path_collection.py export` command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r import export, revision
from agent_r.revision_data import PathSettings
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend

ROOT = Path(__file__).resolve().parents[1]


def revision_rows(root, verifier_labels=None, idx=0):
    cfg = PathSettings(task="textcraft", alpha=0.5, beta=0.5, revise=verifier_labels is not None).revision_config()
    backend = ScriptedBackend(tf.verifier_policy(verifier_labels or {}))
    return revision.process_trees([revision.plan_tree(idx, root, cfg)], cfg, backend)[0].rows


def good_rows(root, idx=0):
    cfg = PathSettings(task="textcraft", alpha=0.5, beta=0.5, data_type="good").revision_config()
    return revision.process_trees([revision.plan_tree(idx, root, cfg)], cfg, None)[0].rows


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_xtuner_sample_ok(sample, bad_turns=()):
    """Every assistant message has a boolean loss; system/user have none; no
    trained turn is one of the bad prefix's turns."""
    for m in sample["messages"]:
        if m["role"] == "assistant":
            assert isinstance(m["loss"], bool)
            if m["loss"]:
                assert m["content"] not in bad_turns
        else:
            assert "loss" not in m
    assert sample["messages"][2] == {"role": "assistant", "content": "Ok.", "loss": False}


def test_xtuner_messages_keep_flags_explicit():
    rows = revision_rows(tf.tree_shared_prefix(), {"get 1 diamond": "Bad"})
    sample = export.xtuner_samples(rows, [], good_ratio=1.0, seed=0)[0]
    bad = {m["content"] for m in rows[0]["revise_log"][4:] if m["role"] == "assistant" and m["loss"] is False}
    assert bad == {tf.turn_text("get 1 oak log"), tf.turn_text("get 1 diamond")}
    assert_xtuner_sample_ok(sample, bad)
    assert [m.get("loss") for m in sample["messages"]] == [None, None, False, None, False, None, False, None,
                                                           True, None, True, None, True, None]
    assert export.xtuner_messages([{"role": "assistant", "content": "x"},
                                   {"role": "assistant", "content": "y", "loss": "False"}]) == [
        {"role": "assistant", "content": "x", "loss": True}, {"role": "assistant", "content": "y", "loss": False}]


def test_good_ratio_mixes_seeded_choice():
    revs = revision_rows(tf.tree_many_leaves(), {})[:4]
    goods = [g for i in range(10) for g in good_rows(tf.tree_one_leaf(), idx=i)]
    assert len(revs) == 4 and len(goods) == 10
    n_good = lambda s: sum(1 for x in s if not any(m["content"].endswith("Action: wait") for m in x["messages"]))  # noqa: E731
    assert n_good(export.xtuner_samples(revs, goods, 0.5, 0)) == 2
    assert len(export.xtuner_samples(revs, goods, 1.0, 0)) == 8
    assert len(export.xtuner_samples(revs, goods, 5.0, 0)) == 14       # capped by what exists
    assert len(export.xtuner_samples(revs, goods, -1, 0)) == 14        # -1 = all
    assert len(export.xtuner_samples([], goods, 0.5, 0)) == 10         # nothing to balance against: all
    assert export.xtuner_samples(revs, goods, 1.0, 3) == export.xtuner_samples(revs, goods, 1.0, 3)
    assert export.xtuner_samples(revs, goods, 1.0, 3) != export.xtuner_samples(revs, goods, 1.0, 4)


def test_dpo_layouts_split_at_the_shared_prefix():
    row = revision_rows(tf.tree_shared_prefix(), None)[0]
    turn = tf.turn_text
    trl = export.dpo_pairs([row], "trl")[0]
    assert set(trl) == {"prompt", "chosen", "rejected"}
    assert [m["role"] for m in trl["prompt"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert trl["prompt"][4] == {"role": "assistant", "content": turn("get 1 oak log")}
    # TRL: one step, the first turns where the paths part (no observation in a completion)
    assert trl["chosen"] == [{"role": "assistant", "content": turn("craft 4 oak planks using 1 oak log")}]
    assert trl["rejected"] == [{"role": "assistant", "content": turn("get 1 diamond")}]
    assert export.dpo_pairs([row, row], "trl") == [trl]                 # the same step pair once
    eto = export.dpo_pairs([row, row], "eto")
    assert [e["id"] for e in eto] == ["0_0", "0_1"]
    assert eto[0]["prompt"][0] == {"from": "human", "value": tf.INSTRUCTION}
    assert [t["from"] for t in eto[0]["prompt"]] == ["human", "gpt", "human", "gpt", "human"]
    assert eto[0]["chosen"][-1] == {"from": "gpt", "value": turn("craft 4 stick using 2 oak planks")}
    assert [t["from"] for t in eto[0]["rejected"]] == ["gpt", "human", "gpt"]


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
