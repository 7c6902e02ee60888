"""Step checkpoints of the CPU trainer: a LoRA fine-tune stopped after a step
and run again goes on from its checkpoint (half the bytes of the fp32 state)
and writes nearly the adapter of one that never stopped, and exactly that
adapter from a checkpoint of the earlier fp32 format; a checkpoint of other
inputs or other start weights is never resumed; a save cut between its two
renames is still found."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

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


def adapter(out) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "adapter" / "adapter_model.safetensors"))


def cut_at(setup, out, monkeypatch, step: int) -> None:
    with monkeypatch.context() as m:
        stop_after(m, step)
        with pytest.raises(Stop):
            tune(setup, out)


def cut_in_another_process(setup, out, step: int) -> None:
    """As on another machine: the resume must build the same start weights
    (the saved changes are added to them) in a process of its own, with
    another hash seed."""
    base, data = setup
    code = ("import pytest, sys; from pathlib import Path; from tests.training import test_step_checkpoint as t; "
            "mp = pytest.MonkeyPatch(); t.stop_after(mp, int(sys.argv[3]))\n"
            "try: t.tune((sys.argv[1], sys.argv[2]), Path(sys.argv[4]))\n"
            "except t.Stop: sys.exit(0)\nsys.exit(1)")
    done = subprocess.run([sys.executable, "-c", code, str(base), str(data), str(step), str(out)],
                          env={**os.environ, "PYTHONHASHSEED": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_stopped_fine_tune_resumes_to_nearly_the_same_adapter(setup, tmp_path, monkeypatch):
    whole = tune(setup, tmp_path / "whole")
    assert whole["steps"] == STEPS and "resumed_from_step" not in whole
    assert not (tmp_path / "whole" / "checkpoint").exists()          # removed once the model is saved

    cut_in_another_process(setup, tmp_path / "cut", 3)
    folder = tmp_path / "cut" / "checkpoint"
    progress = json.loads((folder / ckpt.PROGRESS).read_text())
    assert progress["step"] == 3 and [round(x, 4) for x in progress["losses"]] == whole["losses"][:3]
    assert not (tmp_path / "cut" / "hf").exists()
    # half the bytes of the fp32 state it replaces (weights and AdamW's two moments: 12 bytes a parameter)
    assert sorted(p.name for p in folder.iterdir()) == [ckpt.PROGRESS, ckpt.STATE]
    assert (folder / ckpt.STATE).stat().st_size <= 6 * whole["trainable_parameters"]

    resumed = tune(setup, tmp_path / "cut")
    assert resumed["resumed_from_step"] == 3 and resumed["losses"][:3] == whole["losses"][:3]
    assert resumed["losses"][3:] == pytest.approx(whole["losses"][3:], rel=1e-3)
    assert resumed["losses"][3:] != whole["losses"][3:]   # bf16 state: close, not bit-identical (module docstring)
    a, b = adapter(tmp_path / "whole"), adapter(tmp_path / "cut")
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name].float() - b[name].float()).abs().max() <= 0.02 * a[name].float().abs().max(), name
    assert not (tmp_path / "cut" / "checkpoint").exists()


def test_a_checkpoint_of_the_fp32_format_resumes_exactly(setup, tmp_path, monkeypatch):
    """The format of the checkpoints banked before the compact one: fp32
    weights and the optimizer's state dict; a run goes on from one to the
    adapter of a run that never stopped, byte for byte."""
    import torch
    from safetensors.torch import save_file

    whole = tune(setup, tmp_path / "whole")

    def fp32_save(self, done, losses, model, opt):
        self.folder.mkdir(parents=True)
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad},
                  str(self.folder / ckpt.TRAINABLE))
        torch.save(opt.state_dict(), self.folder / ckpt.OPTIMIZER)
        (self.folder / ckpt.PROGRESS).write_text(json.dumps({"key": self.key, "step": done, "adapter": True,
                                                             "losses": losses, "segments": self.segments(done)}))
        raise Stop

    with monkeypatch.context() as m:
        m.setattr(ckpt.StepCheckpoint, "save", fp32_save)
        with pytest.raises(Stop):
            tune(setup, tmp_path / "cut")
    resumed = tune(setup, tmp_path / "cut")
    assert resumed["resumed_from_step"] == 1 and resumed["losses"] == whole["losses"]
    for name in ("adapter_model.safetensors", "adapter_record.json"):
        assert (tmp_path / "cut" / "adapter" / name).read_bytes() == (tmp_path / "whole" / "adapter" / name).read_bytes()


def test_a_checkpoint_of_other_start_weights_is_dropped(setup, tmp_path, monkeypatch, caplog):
    """The saved changes are added to the start weights the rerun builds;
    where those differ (another initialisation), adding them would be
    wrong, so the fine-tune starts over."""
    cut_at(setup, tmp_path, monkeypatch, 2)
    progress = tmp_path / "checkpoint" / ckpt.PROGRESS
    progress.write_text(json.dumps({**json.loads(progress.read_text()), "start_sha256": "0" * 64}))
    with caplog.at_level(logging.WARNING):
        again = tune(setup, tmp_path)
    assert "resumed_from_step" not in again and "other start weights" in caplog.text


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
