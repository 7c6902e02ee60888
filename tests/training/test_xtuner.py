"""XTuner training: the shipped config loads and builds our export with the
right label masks, general data is mixed at ETA, and xtuner_config/train.sh
fully fine-tunes the tiny Llama on CPU (plain and DeepSpeed ZeRO-2), the loss
falls, and the converted model keeps its tied weights as one tensor and loads
in the collection side's hf backend.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig
from agent_r.training.data import mix, sharegpt_to_messages
from tests.support.model_fixtures import free_port
from tests.support.saved_models import assert_saved_tied
from tests.training.conftest import CPU_CONFIG, ROOT, SUPPORT, inspect_config, run_train_env

SHIPPED = ROOT / "xtuner_config" / "agent_r_llama3_8b_full.py"
REFERENCE_NAME = ROOT / "xtuner_config" / "llama3_8b_instruct_full_alpaca_e3_copy.py"
EOT = "<|eot_id|>"


def test_shipped_config_defaults(tiny_model_dir):
    for config in (SHIPPED, REFERENCE_NAME):  # one source of truth under both names
        info = inspect_config(config, "settings", MODEL_DIR=tiny_model_dir)
        assert (info["lr"], info["max_epochs"], info["max_length"], info["accumulative_counts"]) == \
            (2e-5, 3, 4096, 16)
        assert "AmpOptimWrapper" in info["optim_wrapper"]


def test_label_masks_follow_each_turns_loss_flag(agent_export, tiny_model_dir):
    """Trained tokens are exactly the loss:true assistant turns, each with its
    <|eot_id|>; loss:false turns (the bad prefix, "Ok."), their end-of-turn
    token and every system/user token get -100."""
    samples = json.loads(agent_export.read_text())
    turns = [m for s in samples for m in s["messages"][3:] if m["role"] == "assistant"]  # after "Ok."
    assert any(m["loss"] for m in turns) and any(not m["loss"] for m in turns)  # bad prefixes present
    info = inspect_config(SHIPPED, "tokenized", MODEL_DIR=tiny_model_dir, DATA_FILES=agent_export, PACK=0,
                          MAX_LENGTH=8192)
    built = info["samples"]
    assert len(built) == len(samples)  # unpacked, in file order
    for sample, got in zip(samples, built):
        trained = [m["content"] + EOT for m in sample["messages"] if m["role"] == "assistant" and m["loss"]]
        assert got["runs"] == trained
        assert got["bos_first"]
        assert 0 < got["ignored"] < got["tokens"]


def test_general_data_is_mixed_at_eta(agent_export, general_data, tiny_model_dir, tmp_path):
    agent = json.loads(agent_export.read_text())
    many = tmp_path / "agent.json"
    many.write_text(json.dumps(agent * 6))  # enough samples for a 0.2 share to be visible
    general = json.loads(general_data.read_text())
    convs = [sharegpt_to_messages(g["conversations"]) for g in general]
    usable = [json.dumps(c) for c in convs if c is not None]

    assert len(usable) == 20
    for eta in (0.2, 1.5):  # 1.5: more than the file has -> every conversation repeated
        records = inspect_config(SHIPPED, "raw", MODEL_DIR=tiny_model_dir, DATA_FILES=many,
                                 GENERAL_DATA=general_data, ETA=eta)["records"]
        n_agent = len(agent) * 6
        # Arrow adds "loss": null to non-assistant messages; drop it to compare.
        rows = [json.dumps([{k: v for k, v in m.items() if v is not None} for m in r["messages"]])
                for r in records]
        general_rows = [r for r in rows if r in usable]
        assert len(records) == n_agent + round(eta * n_agent)
        assert len(general_rows) == round(eta * n_agent)
        if eta < 1:
            assert len(set(general_rows)) == len(general_rows)  # without replacement
        else:
            assert set(general_rows) == set(usable)  # every conversation, repeated
    zero = inspect_config(SHIPPED, "raw", MODEL_DIR=tiny_model_dir, DATA_FILES=many, ETA=0,
                          GENERAL_DATA=general_data)["records"]
    assert len(zero) == len(agent) * 6


def test_mix_and_sharegpt_conversion():
    agent = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(10)]
    general = [{"messages": [{"role": "user", "content": f"g{i}"}]} for i in range(3)]
    out = mix(agent, general, 0.2, seed=0)
    assert len(out) == 12 and sum(r in general for r in out) == 2 and all(a in out for a in agent)
    assert out == mix(agent, general, 0.2, seed=0) and out != mix(agent, general, 0.2, seed=3)
    assert sum(r in general for r in mix(agent, general, 0.7, seed=0)) == 7  # 2 full copies + 1
    msgs = sharegpt_to_messages([{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                 {"from": "gpt", "value": "a"}])
    assert msgs == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", "loss": True}]
    assert sharegpt_to_messages([{"from": "human", "value": "q"}]) is None  # nothing to train
    assert sharegpt_to_messages([{"from": "bard", "value": "q"}]) is None


def test_bad_training_data_fails_with_one_clear_line(tmp_path, tiny_model_dir):
    no_flag = tmp_path / "reference_format.json"
    no_flag.write_text(json.dumps([{"messages": [{"role": "user", "content": "q"},
                                                 {"role": "assistant", "content": "a"}]}]))
    r = run_train_env([str(ROOT / ".venv-train" / "bin" / "python"), str(SUPPORT / "inspect_config.py"),
                       str(SHIPPED), "raw"], check=False, MODEL_DIR=tiny_model_dir, DATA_FILES=no_flag)
    assert r.returncode != 0 and "no boolean 'loss' flag" in r.stderr and "path_collection.py export" in r.stderr
    r = run_train_env(["bash", str(ROOT / "xtuner_config" / "train.sh")], check=False, MODEL_DIR=tiny_model_dir)
    assert r.returncode == 2 and r.stderr.startswith("error: DATA_FILES is not set")
    r = run_train_env(["bash", str(ROOT / "xtuner_config" / "train.sh")], check=False, MODEL_DIR=tiny_model_dir,
                      DATA_FILES=no_flag, NPROC_PER_NODE="eight")
    assert r.returncode == 2 and "NPROC_PER_NODE=eight" in r.stderr


def _losses(work_dir: Path) -> list[float]:
    """Logged training losses of every run in work_dir (one folder per run), in order."""
    return [json.loads(line)["loss"] for scalars in sorted(work_dir.glob("*/vis_data/scalars.json"))
            for line in scalars.read_text().splitlines() if '"loss"' in line]


@pytest.mark.parametrize("deepspeed", ["none", str(SUPPORT / "deepspeed_zero2_cpu.json")],
                         ids=["plain", "deepspeed_zero2"])
def test_train_sh_fine_tunes_and_converts_for_the_hf_backend(deepspeed, agent_export, tiny_model_dir, tmp_path):
    work = tmp_path / "work"
    r = run_train_env(["bash", str(ROOT / "xtuner_config" / "train.sh"), "--cfg-options",
                       "default_hooks.logger.interval=1"], timeout=600,
                      CONFIG=CPU_CONFIG, DEEPSPEED=deepspeed, MODEL_DIR=tiny_model_dir, DATA_FILES=agent_export,
                      WORK_DIR=work, MAX_LENGTH=512, EPOCHS=4, LR=2e-3, ACCUMULATIVE_COUNTS=1, WARMUP_RATIO=0,
                      SAVE_FP32=1, PORT=free_port())
    losses = _losses(work)
    assert len(losses) >= 8, r.stdout[-2000:]
    k = len(losses) // 4
    assert sum(losses[-k:]) / k < 0.8 * sum(losses[:k]) / k, losses
    pth = Path((work / "last_checkpoint").read_text().strip())
    assert pth.is_dir() == (deepspeed != "none")  # DeepSpeed writes a ZeRO checkpoint directory
    hf = work / "hf"
    assert r.stdout.strip().splitlines()[-1] == f"next iteration: export MODEL_DIR={hf}"
    assert (hf / "config.json").exists() and list(hf.glob("*.safetensors"))
    assert_saved_tied(hf, tiny_model_dir)   # pth_to_hf alone writes the tied pair twice

    if deepspeed == "none":  # a rerun resumes at the last checkpoint: no step repeated, model rebuilt
        again = run_train_env(["bash", str(ROOT / "xtuner_config" / "train.sh")], timeout=600, CONFIG=CPU_CONFIG,
                              DEEPSPEED=deepspeed, MODEL_DIR=tiny_model_dir, DATA_FILES=agent_export,
                              WORK_DIR=work, MAX_LENGTH=512, EPOCHS=4, LR=2e-3, ACCUMULATIVE_COUNTS=1,
                              WARMUP_RATIO=0, SAVE_FP32=1, PORT=free_port())
        assert again.stdout.startswith(f"resuming from {pth}")
        assert "Iter(train)" not in again.stdout + again.stderr and _losses(work) == losses
        assert sorted(p.name for p in work.iterdir() if p.name.startswith("hf")) == ["hf"]

    backend = HFBackend(str(hf), device="cpu")
    try:
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: craft stick."}]
        out = backend.generate([GenerationRequest(msgs, n=2)], SamplingConfig(temperature=1.0, max_new_tokens=12))
        assert len(out) == 1 and len(out[0]) == 2 and all(isinstance(t, str) for t in out[0])
        assert backend.count_tokens(msgs) > 10
    finally:
        backend.close()


def test_missing_training_env_is_reported(tmp_path):
    """Without .venv-train the helper fails (never skips) naming the fix."""
    code = ("import pytest, tests.training.conftest as c, pathlib;"
            f"c.TRAIN_VENV = pathlib.Path({str(tmp_path)!r});"
            "\ntry:\n    c.train_env()\nexcept pytest.fail.Exception as e:\n    print(e)")
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert "make setup-train" in r.stdout, r.stderr


def test_plain_xtuner_cli_runs_the_config_from_any_directory(agent_export, tiny_model_dir, tmp_path):
    """`xtuner train` / `xtuner convert pth_to_hf` (the reference README's
    commands) start XTuner's tools as scripts from anywhere: with the
    repository on PYTHONPATH (as run_train_env puts it, and as docs/training.md
    tells a user) the config finds agent_r. The CLI exits 0 even on failure:
    check outputs."""
    work, hf = tmp_path / "work", tmp_path / "hf"
    settings = dict(MODEL_DIR=tiny_model_dir, DATA_FILES=agent_export, MAX_LENGTH=512, EPOCHS=1,
                    ACCUMULATIVE_COUNTS=1, WARMUP_RATIO=0)
    r = run_train_env(["xtuner", "train", str(CPU_CONFIG), "--work-dir", str(work)], cwd=tmp_path, **settings)
    pth = (work / "last_checkpoint").read_text().strip()
    assert Path(pth).is_file(), r.stderr[-3000:]
    r = run_train_env(["xtuner", "convert", "pth_to_hf", str(CPU_CONFIG), pth, str(hf)], cwd=tmp_path, **settings)
    assert (hf / "config.json").exists() and (hf / "tokenizer.json").exists(), r.stderr[-3000:]


def test_config_without_the_repository_on_pythonpath_names_the_fix(tiny_model_dir, tmp_path):
    """The config imports agent_r and never edits sys.path: without the
    repository on PYTHONPATH it stops with one line saying what to set."""
    r = run_train_env([str(ROOT / ".venv-train" / "bin" / "python"), str(SUPPORT / "inspect_config.py"),
                       str(SHIPPED), "settings"], check=False, cwd=tmp_path, MODEL_DIR=tiny_model_dir,
                      PYTHONPATH=SUPPORT)
    assert r.returncode != 0
    assert "put the Agent-R repository on PYTHONPATH" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]


def test_agent_r_never_imports_xtuner_config_and_the_configs_edit_no_import_path():
    """The dependency points one way: xtuner_config/ imports agent_r (its
    settings and data loaders live in agent_r/training/), never the reverse;
    the configs leave sys.path alone (the launcher sets PYTHONPATH)."""
    import ast

    for path in sorted((ROOT / "agent_r").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "xtuner_config" for n in names), f"{path} imports xtuner_config"
    for path in sorted((ROOT / "xtuner_config").glob("*.py")):
        assert "sys.path" not in path.read_text(), f"{path} edits sys.path"
