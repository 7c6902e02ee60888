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
from tests.support.model_fixtures import free_port
from tests.training.conftest import CPU_CONFIG, ROOT, SUPPORT, train_env

# on CPU the ranks meet over gloo (the shipped config's NCCL needs GPUs)
GLOO = ["--cfg-options", "env_cfg.dist_cfg.backend=gloo", "default_hooks.logger.interval=1"]


def test_two_launchers_train_one_model_that_eval_loads(agent_export, tiny_model_dir, tmp_path):
    work, port = tmp_path / "work", free_port()
    settings = dict(CONFIG=CPU_CONFIG, DEEPSPEED=SUPPORT / "deepspeed_zero2_cpu.json", MODEL_DIR=tiny_model_dir,
                    DATA_FILES=agent_export, WORK_DIR=work, MAX_LENGTH=512, EPOCHS=2, LR=2e-3,
                    ACCUMULATIVE_COUNTS=1, WARMUP_RATIO=0, SAVE_FP32=1, NNODES=2, NPROC_PER_NODE=1,
                    ADDR="127.0.0.1", PORT=port)
    nodes = [subprocess.Popen(["bash", str(ROOT / "xtuner_config" / "train.sh"), *GLOO], cwd=ROOT,
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
