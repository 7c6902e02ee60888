"""What reproduction/pieces.py's docs promise of the bank, each held by a
test that fails when it breaks (synthetic run folders: no model needed)."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from agent_r.settings import UsageError
from reproduction import pieces
from tests.loop.conftest import ROOT

MODEL = Path("iter_1") / "model" / "agent-r"


def trained(run: Path, rel: Path = MODEL, weights: bytes = b"w" * 4096) -> Path:
    """A finished LoRA fine-tune: its marker and adapter files."""
    folder = run / rel
    (folder / "adapter").mkdir(parents=True)
    (folder / ".done.json").write_text(json.dumps({"stage": "train", "stats": {}, "seconds": 1}))
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(weights)
    (folder / "adapter" / "adapter_record.json").write_text("{}")
    return folder


def test_rebanking_the_same_files_does_not_count_them_twice(tmp_path):
    trained(tmp_path / "run", weights=b"w" * 600_000)
    limit = 0.9   # MB: room for the adapter once, not twice
    pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=limit)
    pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=limit)      # the same bytes again: still fits
    with pytest.raises(UsageError, match="past its 0.9 MB limit"):
        trained(tmp_path / "run", MODEL.parent / "direct", weights=b"v" * 600_000)
        pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=limit)


def test_the_documented_100_mb_limit_is_the_default():
    assert pieces.LIMIT_MB == 100
    assert "(100 MB)" in pieces.__doc__
    done = subprocess.run([sys.executable, "-m", "reproduction.pieces", "bank", "--help"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert "(default 100)" in " ".join(done.stdout.split())


def test_a_loose_file_whose_bytes_changed_is_banked_again(tmp_path):
    folder = trained(tmp_path / "run")
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"retrained" * 100)
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    assert (tmp_path / "bank" / MODEL / "adapter" / "adapter_model.safetensors").read_bytes() == b"retrained" * 100


def test_restore_never_writes_over_a_runs_own_adapter(tmp_path):
    trained(tmp_path / "run")
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    own = trained(tmp_path / "other", weights=b"mine")
    pieces.restore(tmp_path / "bank", tmp_path / "other")
    assert (own / "adapter" / "adapter_model.safetensors").read_bytes() == b"mine"


def test_a_piece_of_a_later_iteration_banks_nothing_of_the_iterations_it_links(tmp_path):
    whole = tmp_path / "whole"
    trained(whole)
    (whole / "iter_1" / "eval" / "agent-r" / "textcraft" / "m_test").mkdir(parents=True)
    (whole / "iter_1" / "eval" / "agent-r" / "textcraft" / "m_test" / "search_results_3.json").write_text("{}")
    piece = tmp_path / "piece"
    piece.mkdir()
    (piece / "iter_1").symlink_to(whole / "iter_1")                    # as reproduce_paper.sh links them
    pieces.bank(piece, tmp_path / "bank")
    banked = [p.relative_to(tmp_path / "bank") for p in (tmp_path / "bank").rglob("*") if p.is_file()]
    assert banked == [Path(pieces.ARCHIVE)]
    with tarfile.open(tmp_path / "bank" / pieces.ARCHIVE) as tar:
        assert tar.getnames() == []


@pytest.mark.parametrize("adapter, banked", [(True, True), (False, False)])
def test_only_a_lora_fine_tunes_step_checkpoint_is_banked(tmp_path, adapter, banked):
    """A full fine-tune's checkpoint (the whole model and its optimizer) is never banked."""
    from agent_r.training.checkpoint import STATE, PROGRESS

    folder = tmp_path / "run" / MODEL / "checkpoint"
    folder.mkdir(parents=True)
    (folder / PROGRESS).write_text(json.dumps({"step": 3, "adapter": adapter}))
    (folder / STATE).write_bytes(b"o" * 100)
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    assert (tmp_path / "bank" / MODEL / "checkpoint" / STATE).exists() == banked


def test_an_evals_episode_archive_grows_with_its_eval(tmp_path):
    folder = tmp_path / "run" / "iter_1" / "eval" / "agent-r" / "textcraft" / "m_test"
    folder.mkdir(parents=True)
    (folder / "search_results_1.json").write_text("{}")
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    (folder / "search_results_2.json").write_text("{}")               # the eval went on
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    archive = pieces.episode_archive(tmp_path / "bank", folder.relative_to(tmp_path / "run"))
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["search_results_1.json", "search_results_2.json"]


def test_a_checkpoint_that_does_not_fit_is_left_out_and_the_rest_is_banked(tmp_path, caplog):
    """A fine-tune's step checkpoint must not hold back the episodes and adapters beside it."""
    from agent_r.training.checkpoint import STATE, PROGRESS

    trained(tmp_path / "run", weights=b"w" * 300_000)
    folder = tmp_path / "run" / MODEL.parent / "direct" / "checkpoint"
    folder.mkdir(parents=True)
    (folder / PROGRESS).write_text(json.dumps({"step": 3, "adapter": True}))
    (folder / STATE).write_bytes(b"o" * 800_000)
    episodes = tmp_path / "run" / "iter_1" / "eval" / "agent-r" / "textcraft" / "m_test"
    episodes.mkdir(parents=True)
    (episodes / "search_results_1.json").write_text("{}")
    with caplog.at_level("WARNING"):
        pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=0.9)
    bank = tmp_path / "bank"
    assert (bank / MODEL / "adapter" / "adapter_model.safetensors").is_file()
    assert pieces.episode_archive(bank, episodes.relative_to(tmp_path / "run")).is_file()
    assert not (bank / MODEL.parent / "direct" / "checkpoint").exists()
    assert "state.safetensors.gz" in caplog.text and "without the step checkpoint of iter_1/model/direct" in caplog.text


def test_an_earlier_checkpoint_stays_banked_when_the_newer_one_does_not_fit(tmp_path):
    from agent_r.training.checkpoint import STATE, PROGRESS

    folder = tmp_path / "run" / MODEL / "checkpoint"
    folder.mkdir(parents=True)
    (folder / PROGRESS).write_text(json.dumps({"step": 3, "adapter": True}))
    (folder / STATE).write_bytes(b"o" * 400_000)
    pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=0.9)
    (folder / PROGRESS).write_text(json.dumps({"step": 4, "adapter": True}))
    (folder / STATE).write_bytes(b"n" * 1_000_000)                 # grew past the limit
    pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=0.9)
    banked = tmp_path / "bank" / MODEL / "checkpoint"
    assert json.loads((banked / PROGRESS).read_text())["step"] == 3
    assert (banked / STATE).read_bytes() == b"o" * 400_000


def test_a_bank_too_big_without_any_checkpoint_is_still_refused(tmp_path):
    trained(tmp_path / "run", weights=b"w" * 1_000_000)
    folder = tmp_path / "run" / MODEL.parent / "direct" / "checkpoint"
    folder.mkdir(parents=True)
    (folder / "progress.json").write_text(json.dumps({"step": 3, "adapter": True}))
    with pytest.raises(UsageError, match="adapter_model.safetensors .* past its 0.9 MB limit"):
        pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=0.9)


def checkpoint(run: Path, variant: str, size: int) -> Path:
    from agent_r.training.checkpoint import STATE, PROGRESS

    folder = run / MODEL.parent / variant / "checkpoint"
    folder.mkdir(parents=True)
    (folder / PROGRESS).write_text(json.dumps({"step": 3, "adapter": True}))
    (folder / STATE).write_bytes(b"o" * size)
    return folder


def test_of_two_fine_tunes_checkpoints_the_one_that_fits_is_banked(tmp_path):
    """Two lanes fine-tune side by side; only one checkpoint fits the limit: that one is banked,
    not neither (a fresh machine then resumes one fine-tune instead of starting both over)."""
    checkpoint(tmp_path / "run", "agent-r", 500_000)
    checkpoint(tmp_path / "run", "direct", 500_000)
    pieces.bank(tmp_path / "run", tmp_path / "bank", limit_mb=0.9)
    banked = [v for v in ("agent-r", "direct") if (tmp_path / "bank" / MODEL.parent / v / "checkpoint").exists()]
    assert banked == ["agent-r"]


def test_the_same_state_banks_the_same_bytes_whatever_the_files_times(tmp_path, monkeypatch):
    """No time stamp in an archive (neither the files' nor the clock's): banking nothing new
    changes nothing to commit."""
    import os
    import time

    trained(tmp_path / "run")
    episodes = tmp_path / "run" / "iter_1" / "eval" / "agent-r" / "textcraft" / "m_test"
    episodes.mkdir(parents=True)
    (episodes / "search_results_1.json").write_text("{}")
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    before = {p: p.read_bytes() for p in (tmp_path / "bank").rglob("*") if p.is_file()}
    for path in (tmp_path / "run").rglob("*"):
        os.utime(path, (1_000_000_000, 1_000_000_000))   # the same files, other times
    later = time.time() + 86_400
    monkeypatch.setattr(time, "time", lambda: later)        # and a day later by the clock
    pieces.bank(tmp_path / "run", tmp_path / "bank")
    assert {p: p.read_bytes() for p in (tmp_path / "bank").rglob("*") if p.is_file()} == before
    assert len(before) >= 3
