"""The LoRA learning-rate check (scripts/lora_lr_check.py) on a tiny model:
it measures the start model and each LR on held-out rows, a rate large enough
to learn the revision turn lowers that turn's held-out loss, and a rerun reads
finished rates back instead of training again."""
from __future__ import annotations

import json

import pytest

from agent_r.revision import REVISION_THOUGHTS
from agent_r.settings import UsageError
from agent_r.training import cpu
from scripts import lora_lr_check
from tests.support.chat_families import build_family_model

REVISION = f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait"


def revision_row(item: str) -> dict:
    return {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Goal: craft {item}."},
        {"role": "assistant", "content": f"Thought: get {item}.\nAction: get 1 {item}", "loss": False},
        {"role": "user", "content": f"Could not find {item}"},
        {"role": "assistant", "content": REVISION, "loss": True},
        {"role": "user", "content": "ok."},
        {"role": "assistant", "content": f"Thought: craft {item}.\nAction: craft 1 {item}", "loss": True}]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lr_check")
    train, val = root / "train.json", root / "val.json"
    train.write_text(json.dumps([revision_row(i) for i in ("oak planks", "stick", "torch", "ladder")]))
    val.write_text(json.dumps([revision_row(i) for i in ("chest", "bowl")]))
    return build_family_model(root / "model", "chatml", hidden=64), train, val


def run(model, train, val, out, lrs="1e-4,3e-2"):
    return lora_lr_check.main(["--model_dir", model, "--train_files", str(train), "--val_files", str(val),
                               "--out", str(out), "--lrs", lrs, "--epochs", "8", "--accumulative_counts", "1",
                               "--eta", "0", "--rank", "4", "--threads", "1"])


def test_each_rate_is_measured_on_the_held_out_rows_and_a_rerun_trains_nothing(files, tmp_path, monkeypatch, capsys):
    model, train, val = files
    assert run(model, train, val, tmp_path) == 0
    rows = {r["lr"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("lr_*.json"))}
    assert sorted(rows) == [0.0, 1e-4, 3e-2]
    start, small, large = rows[0.0], rows[1e-4], rows[3e-2]
    assert start["val_revision_rows"] == 2 and start["train_rows"] == 4
    # the revision turn is the same sentence in every row: a rate that learns it must lower its held-out loss
    assert large["val_revision_loss"] < start["val_revision_loss"] - 1.0
    assert abs(small["val_revision_loss"] - start["val_revision_loss"]) < abs(large["val_revision_loss"] - start["val_revision_loss"])
    assert large["steps"] == 8 * 4 and not (tmp_path / "lr_0.03" / "hf").exists()   # the merged model is removed
    assert (tmp_path / "lr_0.03" / "adapter" / "adapter_model.safetensors").exists()
    table = capsys.readouterr().out
    assert "| 0.03 | 32 |" in table and "(start model)" in table

    monkeypatch.setattr(cpu, "fine_tune", lambda *a, **k: pytest.fail("a finished rate was trained again"))
    assert run(model, train, val, tmp_path) == 0
    assert capsys.readouterr().out == table


def test_only_revision_turns_count_in_the_revision_loss():
    rows = lora_lr_check.revision_only([revision_row("bowl"), {"messages": revision_row("cup")["messages"][:4]}])
    assert len(rows) == 1
    trained = [m["content"] for m in rows[0]["messages"] if m.get("loss")]
    assert trained == [REVISION]


def test_a_missing_export_file_is_a_one_line_error(files, tmp_path):
    model, train, _ = files
    with pytest.raises(UsageError, match="nope.json: cannot read an export file"):
        lora_lr_check.check(lora_lr_check.parse(lora_lr_check.CheckSettings, [
            "--train_files", str(train), "--val_files", str(tmp_path / "nope.json"), "--out", str(tmp_path)]))
