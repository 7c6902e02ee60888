"""A rerun with another LORA_RANK fine-tunes again instead of reusing the old
model, and redoes exactly what depends on it: from the first iteration made
otherwise, every fine-tune and every eval of the old models (under every
reply and tag), and the later iterations' searches and data (the old models
made them); the search and data of that first iteration, made by the model
before it, stay. A stale eval or search folder left behind would be resumed
as the new model's (or refused as another model's)."""
from __future__ import annotations

from pathlib import Path

from agent_r.io import atomic_write_json
from agent_r.loop.runner import redo_other_fine_tunes
from agent_r.loop.stages import MARKER
from agent_r.paths import Layout
from agent_r.training.adapter import ADAPTER_RECORD, Lora, lora_record
from tests.loop.conftest import FLAGS, SMALL, settings_for

EVALS = ("eval", "eval_wait_ok", "eval_fp32", "eval_fp32_wait_ok")


def done(folder: Path, stage: str) -> Path:
    atomic_write_json(folder / MARKER, {"stage": stage, "stats": {}, "seconds": 0})
    (folder / "result.json").write_text("{}")
    return folder


def made_run(root: Path, rank: int) -> Layout:
    """Two finished iterations of agent-r with LoRA adapters of ``rank``, evaluated under two replies and a tag."""
    lay = Layout(root)
    for k in (1, 2):
        done(lay.trees(k, "base" if k == 1 else "agent-r"), "search")
        done(lay.data(k, "agent-r"), "data")
        model = done(lay.model(k, "agent-r"), "train")
        lay.adapter(k, "agent-r").mkdir(parents=True)
        atomic_write_json(lay.adapter(k, "agent-r") / ADAPTER_RECORD, lora_record(Lora(rank=rank, alpha=2 * rank)))
        assert model.exists()
        for evals in EVALS:
            done(lay.iteration(k) / evals / "agent-r", "eval")
    return lay


def run_settings(tmp_path: Path, rank: int):
    s = settings_for({**SMALL, "VARIANTS": "agent-r", "LORA_RANK": str(rank)},
                     FLAGS + ["--runs_dir", str(tmp_path), "--name", "r"])
    s.finish()
    return s


def test_another_rank_redoes_the_fine_tunes_and_every_eval_and_later_search_but_not_the_first_search(tmp_path):
    lay = made_run(tmp_path / "r", rank=8)
    redo_other_fine_tunes(run_settings(tmp_path, 16), lay)
    for k in (1, 2):
        assert not lay.model(k, "agent-r").exists(), k
        assert not [e for e in EVALS if (lay.iteration(k) / e / "agent-r").exists()], k
    assert (lay.trees(1, "base") / MARKER).exists() and (lay.data(1, "agent-r") / MARKER).exists()
    assert (lay.data(1, "agent-r") / "result.json").exists()
    assert not lay.trees(2, "agent-r").exists() and not lay.data(2, "agent-r").exists()


def test_the_same_rank_redoes_nothing(tmp_path):
    lay = made_run(tmp_path / "r", rank=16)
    before = sorted(p for p in (tmp_path / "r").rglob("*"))
    redo_other_fine_tunes(run_settings(tmp_path, 16), lay)
    assert sorted(p for p in (tmp_path / "r").rglob("*")) == before
