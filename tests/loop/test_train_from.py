"""Which model each iteration fine-tunes and on which data: TRAIN_FROM=base
trains the base model on the exports of iterations 1..k pooled;
TRAIN_FROM=previous (the default) trains model_{k-1} on iteration k's export
only. The trainer here records what it is handed and copies its starting
model (the real CPU trainer is tests/loop/test_end_to_end.py's)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_r.loop import run
from agent_r.training import cpu
from tests.loop.conftest import FLAGS, SMALL, settings_for


@pytest.mark.parametrize("train_from", ["base", "previous"])
def test_each_iteration_trains_the_model_and_data_train_from_names(train_from, base_model, textcraft_server,
                                                                     tmp_path, monkeypatch):
    handed: list[tuple[str, list[str]]] = []

    def recording_trainer(model_dir, data_files, out_dir, knobs, seed=0, threads=0, **_):
        handed.append((model_dir, list(data_files)))
        shutil.copytree(model_dir, out_dir)
        return {"trainer": "cpu", "steps": 1, "first_loss": 1.0, "last_loss": 0.5}

    monkeypatch.setattr(cpu, "fine_tune", recording_trainer)
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "VARIANTS": "good", "TRAIN_FROM": train_from}
    result = run(settings_for(env, FLAGS + ["--revise_limit", "0", "--env_server_base", textcraft_server,
                                            "--runs_dir", str(tmp_path), "--name", train_from]))
    assert result.exit_code == 0, result.incomplete

    root = tmp_path / train_from
    export = lambda k: str(root / f"iter_{k}" / "data" / "good" / "train.json")  # noqa: E731
    assert all(Path(export(k)).exists() for k in (1, 2))
    model_1 = str(root / "iter_1" / "model" / "good" / "hf")
    if train_from == "base":
        assert handed == [(base_model, [export(1)]), (base_model, [export(1), export(2)])]
    else:
        assert handed == [(base_model, [export(1)]), (model_1, [export(2)])]
    rows = {r["iteration"]: r for r in json.loads((root / "results.json").read_text())["rows"]}
    assert rows[2]["started_from"] == (base_model if train_from == "base" else "iter_1/model/good/hf")
