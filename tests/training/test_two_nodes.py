"""Training across nodes: xtuner_config/train.sh started twice, as two nodes
would start it (NNODES=2, NODE_RANK 0 and 1, one ADDR and PORT), trains the
tiny Llama on CPU under DeepSpeed ZeRO-2 as one job of two ranks that meet
over TCP on 127.0.0.1; node 1 leaves the conversion to node 0, which writes a
Hugging Face folder that the collection side's eval loads. What one machine
cannot show: two hosts' network (NCCL over InfiniBand or sockets), GPUs, and
storage that two hosts share (here one folder)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig
from agent_r.loop import IterateSettings
from agent_r.loop.models import ModelPool
from agent_r.loop.train import XTUNER_DIR, knob_env, train_stage
from agent_r.settings import parse
from tests.support.model_fixtures import free_port
from tests.training.conftest import CPU_CONFIG, ROOT, SUPPORT, TRAIN_VENV, train_env

LOG_EVERY_STEP = ["--cfg-options", "default_hooks.logger.interval=1"]


def test_two_launchers_train_one_model_that_eval_loads(agent_export, tiny_model_dir, tmp_path):
    work, port = tmp_path / "work", free_port()
    settings = dict(CONFIG=CPU_CONFIG, DEEPSPEED=SUPPORT / "deepspeed_zero2_cpu.json", MODEL_DIR=tiny_model_dir,
                    DATA_FILES=agent_export, WORK_DIR=work, MAX_LENGTH=512, EPOCHS=2, LR=2e-3,
                    ACCUMULATIVE_COUNTS=1, WARMUP_RATIO=0, SAVE_FP32=1, NNODES=2, NPROC_PER_NODE=1,
                    ADDR="127.0.0.1", PORT=port)
    nodes = [subprocess.Popen(["bash", str(ROOT / "xtuner_config" / "train.sh"), *LOG_EVERY_STEP], cwd=ROOT,
                              env=train_env(**settings, NODE_RANK=rank), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [node.communicate(timeout=900) for node in nodes]
    for node, (out, err) in zip(nodes, outs):
        assert node.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    assert outs[1][0].strip().splitlines()[-1] == "node 1 done; node 0 converts the checkpoint"
    hf = work / "hf"
    assert outs[0][0].strip().splitlines()[-1] == f"next iteration: export MODEL_DIR={hf}"
    # one job of two ranks: the ZeRO-2 checkpoint holds an optimizer shard per rank
    pth = Path((work / "last_checkpoint").read_text().strip())
    shards = sorted(p.name for p in pth.rglob("*optim_states.pt"))
    assert [("pp_rank_0_" in s, "pp_rank_1_" in s) for s in shards] == [(True, False), (False, True)], shards
    logs = [json.loads(line) for line in next(work.glob("*/vis_data/scalars.json")).read_text().splitlines()]
    assert any("loss" in entry for entry in logs)
    backend = HFBackend(str(hf), device="cpu")
    try:
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Goal: craft stick."}]
        out = backend.generate([GenerationRequest(msgs, n=1)], SamplingConfig(temperature=0.0, max_new_tokens=8))
        assert len(out) == 1 and isinstance(out[0][0], str)
    finally:
        backend.close()


def test_the_loops_train_stage_is_node_0_of_a_two_node_fine_tune(agent_export, tiny_model_dir, tmp_path,
                                                                 monkeypatch):
    """TRAINER=xtuner with NNODES=2 NODE_RANK=0 ADDR PORT in the loop's
    environment: its train stage is node 0 of the job, and train.sh started
    beside it as node 1 (same data, model and WORK_DIR) is the other rank;
    the stage ends with the converted model and its steps."""
    port = free_port()
    for name, value in dict(PYTHONPATH=SUPPORT, MAP_NUM_PROC=1, NNODES=2, NODE_RANK=0, NPROC_PER_NODE=1,
                            ADDR="127.0.0.1", PORT=port, OMP_NUM_THREADS=1).items():
        monkeypatch.setenv(name, str(value))
    s = parse(IterateSettings, [], environ={"TRAINER": "xtuner", "TRAIN_VENV": str(TRAIN_VENV), "CONFIG": str(CPU_CONFIG),
                                            "DEEPSPEED": str(SUPPORT / "deepspeed_zero2_cpu.json"), "EPOCHS": "2",
                                            "LR": "1e-3", "ACCUMULATIVE_COUNTS": "1", "WARMUP_RATIO": "0",
                                            "MAX_LENGTH": "512", "MODEL_DIR": tiny_model_dir})
    out = tmp_path / "model"
    node1 = subprocess.Popen(["bash", str(ROOT / "xtuner_config" / "train.sh")], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=train_env(
                                 **knob_env(s.train_knobs(1)), CONFIG=CPU_CONFIG, SEED=s.seed,
                                 DEEPSPEED=SUPPORT / "deepspeed_zero2_cpu.json", MODEL_DIR=tiny_model_dir,
                                 DATA_FILES=agent_export, WORK_DIR=out / XTUNER_DIR, HF_DIR=out / "hf", NNODES=2,
                                 NODE_RANK=1, NPROC_PER_NODE=1, ADDR="127.0.0.1", PORT=port))
    try:
        stats = train_stage(s, ModelPool(0, 512), "xtuner", tiny_model_dir, [str(agent_export)], out)
    finally:
        log = node1.communicate(timeout=900)[0]
    assert node1.returncode == 0 and log.strip().splitlines()[-1] == "node 1 done; node 0 converts the checkpoint", \
        log[-3000:]
    assert stats["trainer"] == "xtuner" and stats["steps"] > 0
    assert (out / "hf" / "config.json").exists() and list((out / "hf").glob("*.safetensors"))
    pth = Path((out / XTUNER_DIR / "last_checkpoint").read_text().strip())
    assert len(list(pth.rglob("*optim_states.pt"))) == 2   # two ranks, one optimizer shard each
