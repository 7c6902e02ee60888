"""LORA_RANK: every fine-tune of a loop run trains an adapter (eto's DPO
too); model_k is model_{k-1} with it merged. The adapters are banked (as loose files) with
the run's small state, and a run restored on a fresh machine rebuilds each
model it needs from them, to the same sha256, without fine-tuning; a bank
that would grow past its size limit is refused with one line naming the file."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from agent_r.io import file_sha256, read_json
from agent_r.loop import run
from agent_r.settings import UsageError
from agent_r.training.adapter import ADAPTER_RECORD, CHECKSUM
from reproduction import pieces
from tests.loop.conftest import FLAGS, ROOT, settings_for


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, base_model, textcraft_server):
    tmp = tmp_path_factory.mktemp("lora")
    env = {"ITERA": "3", "N_GEN": "3", "MAX_DEPTH": "4", "TEMP": "1.0", "ITERATIONS": "2", "VARIANTS": "agent-r,eto",
           "VARIANT_ITERATIONS": "eto=1", "ETO_LR": "1e-3",
           "EPOCHS": "1", "LR": "1e-3", "ACCUMULATIVE_COUNTS": "1", "WARMUP_RATIO": "0", "MAX_LENGTH": "1024",
           "TRAINER": "cpu", "BACKEND": "python:tests.loop.doubles:weights_double", "TASK": "textcraft",
           "MODEL_DIR": base_model, "LORA_RANK": "4"}
    flags = FLAGS + ["--env_server_base", textcraft_server, "--name", "lora"]
    result = run(settings_for(env, flags + ["--runs_dir", str(tmp / "first")]))
    assert result.exit_code == 0, result.incomplete
    return tmp, env, flags, result


def test_each_model_is_its_predecessor_with_its_adapter_merged(lora_run):
    tmp, _, _, _ = lora_run
    root = tmp / "first" / "lora"
    rows = json.loads((root / "results.json").read_text())["rows"]        # paths as committed files give them
    trained = [(r["iteration"], r["variant"], r) for r in rows if r["iteration"]]
    assert [(k, v) for k, v, _ in trained] == [(1, "agent-r"), (1, "eto"), (2, "agent-r")]
    for k, variant, row in trained:
        model = root / f"iter_{k}" / "model" / variant
        record = read_json(model / "adapter" / ADAPTER_RECORD)
        sha = file_sha256(model / "hf" / "model.safetensors")
        assert record[CHECKSUM] == sha == row["model_sha256"]
        assert record["lora"]["rank"] == 4 and record["lora"]["alpha"] == 8
        assert row["train"]["adapter"] == f"iter_{k}/model/{variant}/adapter"
        size = (model / "adapter" / "adapter_model.safetensors").stat().st_size
        assert size < 0.5 * (model / "hf" / "model.safetensors").stat().st_size


def test_a_restored_run_rebuilds_its_models_from_the_banked_adapters(lora_run, monkeypatch):
    tmp, env, flags, _ = lora_run
    first = tmp / "first" / "lora"
    bank = tmp / "bank"
    pieces.bank(first, bank)
    assert (bank / "iter_2" / "model" / "agent-r" / "adapter" / "adapter_model.safetensors").is_file()
    second = tmp / "second" / "lora"
    pieces.restore(bank, second)
    assert not list(second.rglob("model.safetensors"))                  # no weights crossed
    (second / "iter_2" / "eval" / "agent-r" / ".done.json").unlink()     # model_2's eval is still to run

    def no_fine_tune(*args, **kwargs):
        raise AssertionError("a model with a banked adapter was fine-tuned again")

    monkeypatch.setattr("agent_r.loop.train.cpu.fine_tune", no_fine_tune)
    result = run(settings_for(env, flags + ["--runs_dir", str(tmp / "second")]))
    assert result.exit_code == 0, result.incomplete
    for k in (1, 2):   # model_2 needs model_1 to be merged into: both rebuilt, byte for byte
        rel = Path(f"iter_{k}") / "model" / "agent-r" / "hf" / "model.safetensors"
        assert file_sha256(second / rel) == file_sha256(first / rel)
    assert (second / "iter_2" / "eval" / "agent-r" / ".done.json").is_file()


def test_the_bank_refuses_to_grow_past_its_limit_naming_the_file(lora_run):
    tmp, _, _, _ = lora_run
    first = tmp / "first" / "lora"
    with pytest.raises(UsageError, match=r"adapter_model\.safetensors .* past its 0\.01 MB limit"):
        pieces.bank(first, tmp / "small_bank", limit_mb=0.01)
    assert not (tmp / "small_bank").exists()                            # nothing written
    done = subprocess.run([sys.executable, "-m", "reproduction.pieces", "bank", "--run", str(first), "--bank",
                           str(tmp / "small_bank"), "--limit_mb", "0.01"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "adapter_model.safetensors" in lines[0] and "Traceback" not in done.stderr


def test_lora_needs_the_cpu_trainer(base_model):
    from agent_r.loop.train import check_trainer

    env = {"TASK": "textcraft", "MODEL_DIR": base_model, "LORA_RANK": "8"}
    with pytest.raises(UsageError, match="TRAINER=xtuner resolves to xtuner"):
        check_trainer(settings_for({**env, "TRAINER": "xtuner"}, []))
    assert check_trainer(settings_for({**env, "TRAINER": "cpu", "VARIANTS": "agent-r,eto"}, [])) == "cpu"
    assert check_trainer(settings_for({**env, "TRAINER": "cpu"}, [])) == "cpu"
    assert json.dumps(settings_for(env, []).lora_rank) == "8"


class Cut(BaseException):
    """The gate: the machine goes away right after a fine-tune's first checkpoint."""


def test_a_fine_tune_cut_off_goes_on_from_its_banked_checkpoint(lora_run, monkeypatch):
    from agent_r.training import checkpoint

    tmp, env, flags, result = lora_run
    first = tmp / "first" / "lora"
    steps = read_json(first / "iter_1" / "model" / "agent-r" / ".done.json")["stats"]["steps"]
    assert steps >= 2
    pieces.bank(first, tmp / "bank_cut")
    cut = tmp / "cut" / "lora"
    pieces.restore(tmp / "bank_cut", cut)
    for stage in ("model", "eval"):   # iteration 1's agent-r fine-tune (and what follows it) is still to run
        shutil.rmtree(cut / "iter_1" / stage / "agent-r")
    shutil.rmtree(cut / "iter_2")
    for archive in (tmp / "bank_cut" / pieces.EPISODES).glob("iter_*/eval/agent-r/**/*.tar.gz"):
        archive.unlink()   # the first run's evals of its agent-r models: the bank of a run that never made them
    one = {**env, "ITERATIONS": "1", "VARIANTS": "agent-r", "CHECKPOINT_MINUTES": "0"}
    save = checkpoint.StepCheckpoint.save

    def gated(self, done, *args):
        save(self, done, *args)
        raise Cut

    with monkeypatch.context() as m:
        m.setattr(checkpoint.StepCheckpoint, "save", gated)
        with pytest.raises(Cut):
            run(settings_for(one, flags + ["--runs_dir", str(tmp / "cut")]))
    bank = tmp / "bank_cut"
    pieces.bank(cut, bank)
    banked = bank / "iter_1" / "model" / "agent-r" / "checkpoint"
    assert read_json(banked / checkpoint.PROGRESS)["step"] == 1 and (banked / checkpoint.STATE).is_file()

    later = tmp / "later" / "lora"                                      # the next machine
    pieces.restore(bank, later)
    assert run(settings_for(one, flags + ["--runs_dir", str(tmp / "later")])).exit_code == 0
    model = later / "iter_1" / "model" / "agent-r"
    assert read_json(model / ".done.json")["stats"]["resumed_from_step"] == 1
    adapter = Path("adapter") / "adapter_model.safetensors"
    resumed, whole = (load_file(str(m / adapter)) for m in (model, first / "iter_1" / "model" / "agent-r"))
    for name in whole:   # the banked state is bf16 (agent_r/training/checkpoint.py): nearly, not bit for bit
        assert (resumed[name].float() - whole[name].float()).abs().max() <= 0.02 * whole[name].float().abs().max()
    assert not (model / "checkpoint").exists()
    pieces.bank(later, bank)
    assert not banked.exists() and (bank / "iter_1" / "model" / "agent-r" / adapter).is_file()


def test_fine_tune_alone_writes_what_the_loops_train_stage_writes(lora_run, monkeypatch):
    """reproduction.fine_tune (TRAIN_ONLY=1, e.g. on a GPU machine without env
    server or vLLM) on a restored run: model_1 is rebuilt from its adapter,
    not trained again, and model_2's adapter is the loop's, byte for byte."""
    from agent_r.training import cpu
    from reproduction.fine_tune import fine_tune

    tmp, env, flags, _ = lora_run
    first = tmp / "first" / "lora"
    pieces.bank(first, tmp / "bank_ft")
    elsewhere = tmp / "elsewhere" / "lora"
    pieces.restore(tmp / "bank_ft", elsewhere)
    shutil.rmtree(elsewhere / "iter_2" / "model" / "agent-r")
    trained = []
    real = cpu.fine_tune

    def recorded(model_dir, data_files, out_dir, *args, **kwargs):
        trained.append(Path(out_dir).relative_to(elsewhere).parts[0])
        return real(model_dir, data_files, out_dir, *args, **kwargs)

    monkeypatch.setattr("agent_r.loop.train.cpu.fine_tune", recorded)
    two = {**env, "ITERATIONS": "2", "VARIANTS": "agent-r"}
    stats = fine_tune(settings_for(two, flags + ["--runs_dir", str(tmp / "elsewhere")]))
    assert trained == ["iter_2"]                                         # model_1: rebuilt, not fine-tuned
    assert stats["agent-r"]["trainer"] == "cpu" and stats["agent-r"]["device"] == "cpu"
    model = Path("iter_2") / "model" / "agent-r"
    adapter = Path("adapter") / "adapter_model.safetensors"
    assert (elsewhere / model / adapter).read_bytes() == (first / model / adapter).read_bytes()
    assert read_json(elsewhere / model / ".done.json")["stage"] == "train"


def test_fine_tune_alone_needs_the_data_stage_and_a_gpu_where_asked(lora_run, tmp_path):
    from reproduction.fine_tune import fine_tune

    _, env, flags, _ = lora_run
    empty = flags + ["--runs_dir", str(tmp_path)]
    with pytest.raises(UsageError, match="iteration 1's data stage of agent-r is not finished"):
        fine_tune(settings_for({**env, "ITERATIONS": "1", "VARIANTS": "agent-r"}, empty))
    done = subprocess.run([sys.executable, "-m", "reproduction.fine_tune", *empty], cwd=ROOT, capture_output=True,
                          text=True, env={**env, "ITERATIONS": "1", "VARIANTS": "agent-r", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "Traceback" not in done.stderr and "data stage" in done.stderr


def test_train_device_cuda_needs_a_cuda_device_and_the_cpu_trainer(base_model, monkeypatch):
    from agent_r.loop.train import check_trainer

    env = {"TASK": "textcraft", "MODEL_DIR": base_model, "TRAIN_DEVICE": "cuda"}
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(UsageError, match="torch sees no CUDA device here"):
        check_trainer(settings_for({**env, "TRAINER": "cpu"}, []))
    with pytest.raises(UsageError, match="TRAINER=xtuner resolves to xtuner"):
        check_trainer(settings_for({**env, "TRAINER": "xtuner"}, []))
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)   # the GPU machine (a double: none here)
    assert check_trainer(settings_for({**env, "TRAINER": "cpu"}, [])) == "cpu"


class Retrained(BaseException):
    """The gate: the loop reached a fine-tune (no need to let it run)."""


def restored(lora_run, name: str) -> Path:
    tmp, _, _, _ = lora_run
    pieces.bank(tmp / "first" / "lora", tmp / f"bank_{name}")
    run_dir = tmp / name / "lora"
    pieces.restore(tmp / f"bank_{name}", run_dir)
    return run_dir


def test_a_rebuild_that_misses_its_recorded_sha256_is_discarded_and_fine_tuned_again(lora_run, monkeypatch):
    tmp, env, flags, _ = lora_run
    second = restored(lora_run, "tampered")
    record = second / "iter_1" / "model" / "agent-r" / "adapter" / ADAPTER_RECORD
    record.write_text(json.dumps({**read_json(record), CHECKSUM: "0" * 64}))
    (second / "iter_1" / "eval" / "agent-r" / ".done.json").unlink()    # model_1 is needed again
    calls = []

    def fine_tune(start, files, out, *args, **kwargs):
        calls.append(out)
        raise Retrained

    monkeypatch.setattr("agent_r.loop.train.cpu.fine_tune", fine_tune)
    with pytest.raises(Retrained):
        run(settings_for({**env, "ITERATIONS": "1", "VARIANTS": "agent-r"},
                         flags + ["--runs_dir", str(tmp / "tampered")]))
    model = second / "iter_1" / "model" / "agent-r"
    assert calls == [str(model / "hf")]
    assert not (model / "hf").exists() and not (model / ".done.json").exists()   # the wrong weights are gone


@pytest.mark.parametrize("rank", ["8", "0"])
def test_a_rerun_with_another_lora_rank_fine_tunes_again(lora_run, monkeypatch, rank):
    """Not the old model reused: the fine-tune is redone (and what later
    iterations built on the old model); LORA_RANK 0 asks a full fine-tune."""
    tmp, env, flags, _ = lora_run
    name = f"rank{rank}"
    second = restored(lora_run, name)
    calls = []

    def fine_tune(start, files, out, *args, lora=None, **kwargs):
        calls.append((out, lora.rank if lora else 0))
        raise Retrained

    monkeypatch.setattr("agent_r.loop.train.cpu.fine_tune", fine_tune)
    with pytest.raises(Retrained):
        run(settings_for({**env, "LORA_RANK": rank, "VARIANTS": "agent-r"}, flags + ["--runs_dir", str(tmp / name)]))
    assert calls == [(str(second / "iter_1" / "model" / "agent-r" / "hf"), int(rank))]
    for stage in ("trees", "data", "model", "eval"):   # iteration 2 was built on the old model_1: redone too
        assert not (second / "iter_2" / stage / "agent-r" / ".done.json").exists(), stage
    assert (second / "iter_1" / "trees" / "base" / ".done.json").exists()     # the base's search stays


def test_a_rerun_with_the_same_rank_reuses_every_fine_tune(lora_run, monkeypatch):
    tmp, env, flags, _ = lora_run
    restored(lora_run, "same")

    def fine_tune(*args, **kwargs):
        raise AssertionError("a finished fine-tune of the same settings was redone")

    monkeypatch.setattr("agent_r.loop.train.cpu.fine_tune", fine_tune)
    monkeypatch.setattr("agent_r.loop.trl_stages.eto.train_dpo", fine_tune)
    assert run(settings_for(env, flags + ["--runs_dir", str(tmp / "same")])).exit_code == 0


def test_etos_dpo_at_iteration_2_starts_from_and_refers_to_model_1(lora_run, monkeypatch):
    """ETO beyond iteration 1: model_2 is model_1 after DPO against model_1 itself."""
    tmp, env, flags, _ = lora_run
    second = restored(lora_run, "eto2")
    calls = []

    def train_dpo(model_dir, pairs_file, out_dir, cfg, ref_model_dir=None, lora=None):
        calls.append((model_dir, ref_model_dir, lora.rank if lora else 0))
        raise Retrained

    monkeypatch.setattr("agent_r.loop.trl_stages.eto.train_dpo", train_dpo)
    with pytest.raises(Retrained):
        run(settings_for({**env, "VARIANTS": "eto", "VARIANT_ITERATIONS": ""},
                         flags + ["--runs_dir", str(tmp / "eto2")]))
    model_1 = str(second / "iter_1" / "model" / "eto" / "hf")
    assert calls == [(model_1, model_1, 4)]
