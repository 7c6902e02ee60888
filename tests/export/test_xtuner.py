"""The XTuner training file: every assistant message carries an explicit
boolean loss (a string flag becomes one; the bad prefix is never trained),
good samples are mixed in at --good_ratio per revision sample (a seeded
choice; -1 = all), and the file is one compact JSON document whose export
line says how token lengths fared."""
from __future__ import annotations

import json

import pytest

from agent_r import export
from tests.support import tree_fixtures as tf
from tests.support.export_rows import HEAD, assert_xtuner_sample_ok, good_rows, revision_rows, rows


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


def test_string_loss_flags_become_booleans():
    msgs = HEAD + [{"role": "assistant", "content": "a", "loss": " True "},
                   {"role": "user", "content": "o"},
                   {"role": "assistant", "content": "b", "loss": "false"},
                   {"role": "assistant", "content": "c", "loss": "TRUE"},
                   {"role": "assistant", "content": "d"}]
    out = export.xtuner_messages(msgs)
    assert [m["loss"] for m in out if m["role"] == "assistant"] == [False, True, False, True, True]
    assert all("loss" not in m for m in out if m["role"] != "assistant")


@pytest.mark.parametrize("ratio,expected_good", [(0.0, 0), (0.5, 2), (1.0, 4), (-1.0, 6)])
def test_good_ratio(ratio, expected_good):
    rev, good = rows(4, 6)
    samples = export.xtuner_samples(rev, good, ratio, seed=0)
    contents = [s["messages"][-1]["content"] for s in samples]
    assert sum(c.startswith("g") for c in contents) == expected_good
    assert sum(c.startswith("r") for c in contents) == 4


def test_write_export_writes_one_compact_json_document(tmp_path):
    path = tmp_path / "textcraft_centric.jsonl"
    root = tf.tree_many_leaves()
    from agent_r import revision
    from agent_r.revision_data import PathSettings

    cfg = PathSettings(task="textcraft", revise=False).revision_config()
    (res,) = revision.process_trees([revision.plan_tree(1, root, cfg)], cfg, None)
    path.write_text("".join(json.dumps(r) + "\n" for r in res.rows))
    out = tmp_path / "train.json"
    line = export.write_export(export.ExportSettings(format="xtuner", input=[str(path)], output=str(out)))
    assert line.startswith(f"wrote {len(res.rows)} samples ({len(res.rows)} revision + 0 good) to {out}")
    text = out.read_text()
    assert text.count("\n") == 1 and len(json.loads(text)) == len(res.rows)
    dpo = tmp_path / "dpo.json"
    line = export.write_export(export.ExportSettings(format="dpo", input=[str(path)], output=str(dpo)))
    assert "preference pairs (eto layout)" in line and json.loads(dpo.read_text())


def test_xtuner_export_says_how_token_lengths_fared(tmp_path):
    rev, good = rows(1, 1)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rev + good))
    line = export.write_export(export.ExportSettings(format="xtuner", input=[str(path)], output=str(tmp_path / "o")))
    first, note = line.split("\n")
    assert first.startswith("wrote 2 samples") and "token lengths" in note
