"""The TRL trainer as a run: general data mixed at ETA and the warm-up/cosine
schedule reach TRL's steps, outputs (hf/, loss history, stats, TensorBoard
events), a killed run resumes to the same result, a finished one is not
redone, and bad input gets one line."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
from transformers import TrainerCallback

from agent_r.settings import UsageError, run_cli
from agent_r.training import resume, trl_sft
from tests.training_trl.conftest import quick


def test_eta_mixing_and_the_schedule_reach_trl(trl_export, general_file, tiny_model_dir, tmp_path):
    n_agent = len(json.loads(trl_export.read_text()))
    cfg = quick(general_data=str(general_file), eta=0.5, epochs=2, batch_size=2, accumulative_counts=2,
                warmup_ratio=0.25, lr=1e-3)
    stats = trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(tmp_path / "run"), cfg)

    samples = n_agent + round(0.5 * n_agent)            # every sample fits MAX_LENGTH=512
    steps = 2 * math.ceil(math.ceil(samples / 2) / 2)    # epochs x micro-batches / accumulation
    assert (stats["samples"], stats["steps"], stats["global_batch"]) == (samples, steps, 4)
    history = json.loads((tmp_path / "run" / resume.HISTORY).read_text())
    lrs = [row["learning_rate"] for row in history]
    warm = math.ceil(0.25 * steps)
    assert len(lrs) == steps and lrs[0] == 0.0                     # warm-up starts at 0 ...
    assert lrs[warm] == pytest.approx(1e-3) and max(lrs) == pytest.approx(1e-3)   # ... peaks after warm-up
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1:]))                # then cosine decay
    assert lrs[-1] < 0.1 * 1e-3
    assert all(isinstance(row["loss"], float) and "grad_norm" in row for row in history)
    hf = tmp_path / "run" / "hf"
    assert (hf / "config.json").exists() and (hf / "tokenizer.json").exists() and list(hf.glob("*.safetensors"))
    assert not list((tmp_path / "run" / "trainer").glob("checkpoint-*"))       # kept only while unfinished


class KillAtSave(TrainerCallback):
    """Raises once the checkpoint of step ``at`` is on disk: a killed run."""

    def __init__(self, at: int):
        self.at = at

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt("killed after the checkpoint")


def test_a_killed_run_resumes_to_the_same_result_and_a_finished_one_is_not_redone(trl_export, tiny_model_dir,
                                                                                  tmp_path, monkeypatch, caplog):
    cfg = quick(epochs=2, batch_size=2, accumulative_counts=1, save_steps=3, save_total_limit=-1)
    files = [str(trl_export)]
    whole = trl_sft.fine_tune(tiny_model_dir, files, str(tmp_path / "whole"), cfg)

    out = tmp_path / "killed"
    key = resume.run_key(tiny_model_dir, files, cfg)

    def build():
        run = trl_sft.prepare(tiny_model_dir, files, str(out), cfg)
        run.trainer.add_callback(KillAtSave(6))
        return run

    with pytest.raises(KeyboardInterrupt):
        resume.train_once(out, key, build, cfg, {"trainer": "trl"})
    assert sorted(p.name for p in (out / "trainer").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert not (out / "hf").exists() and not (out / resume.DONE).exists()

    with caplog.at_level("INFO", logger="agent_r.training.resume"):
        resumed = trl_sft.fine_tune(tiny_model_dir, files, str(out), cfg)
    assert f"resuming from {out / 'trainer' / 'checkpoint-6'}" in caplog.text
    assert resumed["steps"] == whole["steps"] > 6
    history = json.loads((out / resume.HISTORY).read_text())
    want = json.loads((tmp_path / "whole" / resume.HISTORY).read_text())
    assert [r["step"] for r in history] == [r["step"] for r in want]
    assert [r["loss"] for r in history] == pytest.approx([r["loss"] for r in want], rel=1e-4)

    monkeypatch.setattr(trl_sft, "prepare", lambda *a, **k: pytest.fail("a finished run was built again"))
    assert trl_sft.fine_tune(tiny_model_dir, files, str(out), cfg) == resumed
    with pytest.raises(UsageError, match=r"holds a run with other settings \(lr\)"):
        trl_sft.fine_tune(tiny_model_dir, files, str(out), quick(epochs=2, lr=5e-4))
    # settings that cannot change the model do not block a rerun
    assert trl_sft.fine_tune(tiny_model_dir, files, str(out), quick(epochs=2, save_steps=3, threads=2,
                                                                    save_total_limit=-1)) == resumed


def test_report_to_tensorboard_writes_event_files_offline(trl_export, tiny_model_dir, tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        pytest.fail("tensorboard is missing: pip install -r requirements.txt", pytrace=False)
    trl_sft.fine_tune(tiny_model_dir, [str(trl_export)], str(tmp_path / "run"), quick(report_to="tensorboard"))
    events = list((tmp_path / "run" / "trainer" / "runs").rglob("events.out.tfevents.*"))
    assert events and any(e.stat().st_size > 100 for e in events)


@pytest.mark.parametrize("argv, env, says", [
    ([], {}, "needs --data, --out"),
    (["--data", "{bad}", "--out", "{out}"], {}, "no boolean 'loss' flag"),
    (["--data", "{data}", "--out", "{out}"], {"MODEL_DIR": "{out}/nope"}, "is not a folder"),
    (["--data", "{data}", "--out", "{out}"], {"WARMUP_RATIO": "1.5"}, "must be below 1"),
    (["--data", "{data}", "--out", "{out}"], {"LR_SCHEDULER": "step"}, "not one of"),
])
def test_bad_input_gets_one_line(argv, env, says, trl_export, tiny_model_dir, tmp_path, capsys, monkeypatch):
    bad = tmp_path / "no_flags.json"
    bad.write_text(json.dumps([{"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a"}]}]))
    fill = {"bad": str(bad), "model": tiny_model_dir, "out": str(tmp_path / "out"), "data": str(trl_export)}
    monkeypatch.setenv("MODEL_DIR", tiny_model_dir)
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(**fill))
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: trl_sft.main([a.format(**fill) for a in argv]))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and says in err, err


def test_the_launch_commands_carry_every_knob_and_the_zero2_config_is_one_accelerate_reads():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    from agent_r.settings import parse
    from tests.training_trl.conftest import ROOT

    zero2 = ROOT / "training_configs" / "zero2.yaml"
    c = load_config_from_file(str(zero2))
    assert (c.distributed_type, c.deepspeed_config["zero_stage"], c.mixed_precision) == ("DEEPSPEED", 2, "bf16")

    cfg = quick(general_data="general.json", eta=0.3, report_to="tensorboard")
    argv = trl_sft.command_argv("model", ["a.json", "b.json"], "out", cfg, processes=8, accelerate_config=str(zero2))
    assert argv[0] == "env"
    knobs = dict(a.split("=", 1) for a in argv[1:] if "=" in a and not a.startswith("-"))
    launcher = argv.index("-m")
    assert argv[launcher:launcher + 2] == ["-m", "accelerate.commands.launch"]
    launch = launch_command_parser().parse_args(argv[launcher + 2:])
    assert (launch.num_processes, launch.config_file, launch.module) == (8, str(zero2), True)
    assert launch.training_script == "agent_r.training.trl_sft"
    # every knob arrives through `env` (set over whatever the caller's environment holds)
    ours = parse(trl_sft.TrlCommand, launch.training_script_args, environ=knobs)
    assert (ours.data, ours.model_dir, ours.out, ours.train) == (["a.json", "b.json"], "model", "out", cfg)
    assert set(knobs) == {"MODEL_DIR"} | {f.metadata["env"] for f in dataclasses.fields(cfg) if f.metadata.get("env")}
    single = trl_sft.command_argv("model", ["a.json"], "out", cfg)
    assert single[single.index("-m"):single.index("-m") + 2] == ["-m", "agent_r.training.trl_sft"]


def test_the_loops_training_settings_map_onto_the_trl_knobs():
    from agent_r.loop.settings import IterateSettings
    from agent_r.settings import parse

    loop = parse(IterateSettings, [], {"LR": "3e-4", "EPOCHS": "2", "MAX_LENGTH": "1024", "BATCH_SIZE": "2",
                                       "ACCUMULATIVE_COUNTS": "4", "WARMUP_RATIO": "0.1", "GENERAL_DATA": "g.json",
                                       "ETA": "0.3", "LR_SCHEDULER": "linear", "SEED": "99"})
    cfg = trl_sft.TrlConfig.from_knobs(loop.train, seed=7, trl=loop.trl, threads=2)
    assert (cfg.lr, cfg.epochs, cfg.max_length, cfg.batch_size, cfg.accumulative_counts, cfg.warmup_ratio, cfg.seed,
            cfg.general_data, cfg.eta, cfg.threads) == (3e-4, 2, 1024, 2, 4, 0.1, 7, "g.json", 0.3, 2)
    assert (cfg.weight_decay, cfg.max_grad_norm, cfg.lr_scheduler, cfg.report_to) == (0.0, 1.0, "linear", "none")
    assert trl_sft.TrlConfig.from_knobs(loop.train).lr_scheduler == "cosine"          # TRL knobs' defaults
