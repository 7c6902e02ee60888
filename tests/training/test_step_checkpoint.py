"""Step checkpoints of the CPU trainer: a LoRA fine-tune stopped after a step
and run again goes on from its checkpoint and writes the same adapter, byte
for byte, as one that never stopped; a checkpoint of other inputs is never
resumed; a save cut between its two renames is still found."""
from __future__ import annotations

import json
import logging

import pytest

from agent_r.training import checkpoint as ckpt
from agent_r.training.adapter import Lora
from agent_r.training.cpu import fine_tune
from agent_r.training.settings import TrainKnobs
from tests.support.chat_families import build_family_model
from tests.training.test_chat_formats import SAMPLE

STEPS = 6


class Stop(Exception):
    """The gate: the run is cut right after a step's checkpoint."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    base = build_family_model(root / "base", "chatml", hidden=64)
    data = root / "rows.json"
    rows = [{"messages": SAMPLE[:-1] + [{**SAMPLE[-1], "content": SAMPLE[-1]["content"] + f" {i}"}]} for i in range(3)]
    data.write_text(json.dumps(rows))
    return base, data


def knobs(lr: float = 1e-2) -> TrainKnobs:
    return TrainKnobs(lr=lr, epochs=STEPS, batch_size=1, accumulative_counts=1, warmup_ratio=0.2, max_length=512,
                      general_data="", eta=0.0)


def tune(setup, out, lr: float = 1e-2) -> dict:
    base, data = setup
    return fine_tune(base, [str(data)], str(out / "hf"), knobs(lr), threads=1, lora=Lora(rank=4, alpha=8),
                     adapter_dir=str(out / "adapter"), checkpoint_dir=str(out / "checkpoint"), checkpoint_s=0)


def stop_after(monkeypatch, step: int) -> None:
    save = ckpt.StepCheckpoint.save

    def gated(self, done, losses, model, opt):
        save(self, done, losses, model, opt)
        if done == step:
            raise Stop

    monkeypatch.setattr(ckpt.StepCheckpoint, "save", gated)


def test_a_stopped_fine_tune_resumes_to_the_same_adapter(setup, tmp_path, monkeypatch):
    whole = tune(setup, tmp_path / "whole")
    assert whole["steps"] == STEPS and "resumed_from_step" not in whole
    assert not (tmp_path / "whole" / "checkpoint").exists()          # removed once the model is saved

    with monkeypatch.context() as m:
        stop_after(m, 3)
        with pytest.raises(Stop):
            tune(setup, tmp_path / "cut")
    progress = json.loads((tmp_path / "cut" / "checkpoint" / ckpt.PROGRESS).read_text())
    assert progress["step"] == 3 and [round(x, 4) for x in progress["losses"]] == whole["losses"][:3]
    assert not (tmp_path / "cut" / "hf").exists()

    resumed = tune(setup, tmp_path / "cut")
    assert resumed["resumed_from_step"] == 3 and resumed["losses"] == whole["losses"]
    for name in ("adapter_model.safetensors", "adapter_record.json"):
        assert (tmp_path / "cut" / "adapter" / name).read_bytes() == (tmp_path / "whole" / "adapter" / name).read_bytes()
    assert not (tmp_path / "cut" / "checkpoint").exists()


def test_a_checkpoint_of_other_inputs_is_dropped(setup, tmp_path, monkeypatch, caplog):
    with monkeypatch.context() as m:
        stop_after(m, 2)
        with pytest.raises(Stop):
            tune(setup, tmp_path, lr=1e-2)
    with caplog.at_level(logging.WARNING):
        other = tune(setup, tmp_path, lr=3e-3)
    assert "resumed_from_step" not in other and "checkpoint of other inputs" in caplog.text
    assert other["losses"][0] == pytest.approx(tune(setup, tmp_path / "fresh", lr=3e-3)["losses"][0])


def test_a_save_cut_between_its_renames_is_still_resumed(setup, tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        stop_after(m, 4)
        with pytest.raises(Stop):
            tune(setup, tmp_path)
    folder = tmp_path / "checkpoint"
    folder.rename(folder.with_name("checkpoint.old"))                 # the state after the first rename
    assert tune(setup, tmp_path)["resumed_from_step"] == 4
    assert not folder.with_name("checkpoint.old").exists() and not folder.exists()


def test_a_run_resumed_on_another_machine_records_which_steps_ran_where(setup, tmp_path, monkeypatch):
    from agent_r.training import cpu

    with monkeypatch.context() as m:
        m.setattr(cpu, "machine", lambda: "first box")
        stop_after(m, 2)
        with pytest.raises(Stop):
            tune(setup, tmp_path)
    monkeypatch.setattr(cpu, "machine", lambda: "second box")
    resumed = tune(setup, tmp_path)
    assert [(s["from_step"], s["to_step"], s["machine"], s["precision"]) for s in resumed["segments"]] == [
        (0, 2, "first box", "fp32"), (2, STEPS, "second box", "fp32")]
    assert resumed["precision"] == "fp32"


def test_a_checkpoint_saved_before_segments_were_recorded_says_its_steps_are_unrecorded(setup, tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        stop_after(m, 2)
        with pytest.raises(Stop):
            tune(setup, tmp_path)
    progress = tmp_path / "checkpoint" / ckpt.PROGRESS
    old = json.loads(progress.read_text())
    del old["segments"]
    progress.write_text(json.dumps(old))
    resumed = tune(setup, tmp_path)
    assert resumed["segments"][0] == {"from_step": 0, "to_step": 2}
    assert resumed["precision"] == "mixed: unrecorded then fp32"


def test_a_run_that_mixed_precisions_says_so():
    from agent_r.training.cpu import precision_of

    bf16, fp32 = "bf16 autocast, fp32 weights", "fp32"
    assert precision_of(None, autocast=False) == fp32
    assert precision_of([{"precision": bf16}, {"precision": bf16}], autocast=True) == bf16
    assert precision_of([{"precision": bf16}, {"precision": fp32}], autocast=False) == f"mixed: {bf16} then {fp32}"
    assert precision_of([{}, {"precision": fp32}], autocast=False) == "mixed: unrecorded then fp32"
