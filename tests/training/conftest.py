"""Fixtures for the training tests.

These tests run from the collection env's pytest (.venv) and drive the separate
training env (.venv-train: XTuner 0.2.0, transformers 4.48, DeepSpeed 0.16) as
subprocesses, exactly as a user runs it. Nothing here is a double: the tiny
Llama is real, the export comes from path_collection.py, training is real
`xtuner` code on CPU. CPU-only shims (torchvision stub, bf16 query, the fp32
optimizer wrapper, a DeepSpeed JSON without fp16/bf16) are in
tests/training/support and tests/training/cpu_config.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import tree_fixtures as tf

ROOT = Path(__file__).resolve().parents[2]
TRAIN_VENV = ROOT / ".venv-train"
SUPPORT = ROOT / "tests" / "training" / "support"
CPU_CONFIG = ROOT / "tests" / "training" / "cpu_config.py"
# Settings the configs and scripts read; cleared so the caller's shell cannot leak in.
SETTINGS = ("MODEL_DIR", "DATA_FILES", "GENERAL_DATA", "ETA", "SEED", "MAX_LENGTH", "PACK", "MAP_NUM_PROC",
            "BATCH_SIZE", "ACCUMULATIVE_COUNTS", "EPOCHS", "LR", "WARMUP_RATIO", "SAVE_STEPS",
            "SAVE_TOTAL_LIMIT", "WORK_DIR", "CONFIG", "DEEPSPEED", "HF_DIR", "SAVE_FP32", "NPROC_PER_NODE",
            "NNODES", "NODE_RANK", "ADDR", "PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "VIRTUAL_ENV", "TASK", "MODEL_NAME", "BACKEND")


def train_env(**settings) -> dict[str, str]:
    """Environment for a training-env subprocess: its bin first on PATH (XTuner
    runs a bare `python`), the CPU shims first on PYTHONPATH, then the
    repository (the config imports agent_r; train.sh adds it itself, a plain
    `xtuner train` needs it given, as here)."""
    if not (TRAIN_VENV / "bin" / "python").exists():
        pytest.fail("the training environment .venv-train is missing: run `make setup-train` "
                    "(or `make test`, which builds it)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env.update(PATH=f"{TRAIN_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=f"{SUPPORT}{os.pathsep}{ROOT}",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", MAP_NUM_PROC="1")
    env.update({k: str(v) for k, v in settings.items()})
    return env


def run_train_env(args: list[str], timeout: float = 300, check: bool = True, cwd: Path = ROOT, **settings):
    r = subprocess.run(args, cwd=cwd, env=train_env(**settings), capture_output=True, text=True,
                       timeout=timeout)
    if check:
        assert r.returncode == 0, f"{args} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def inspect_config(config: Path, what: str, **settings) -> dict:
    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), str(SUPPORT / "inspect_config.py"), str(config), what],
                      **settings)
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def agent_export(tmp_path_factory, tiny_model_dir) -> Path:
    """An XTuner export made by path_collection.py (centric + good data, the
    tiny model as verifier) from search trees of known shape."""
    work = tmp_path_factory.mktemp("export")
    trees = work / "mcts_result" / "textcraft" / "tiny"
    for idx, tree in enumerate((tf.tree_many_leaves(), tf.tree_shared_prefix(), tf.tree_split_at_root(),
                                tf.tree_disaster())):
        tf.write_tree(tree, trees, idx)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env.update(TASK="textcraft", MODEL_NAME="tiny", MODEL_DIR=tiny_model_dir, PYTHONPATH=str(ROOT))
    for data_type in ("centric", "good"):
        r = subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "--backend", "hf",
                            "--max_new_tokens", "8", "--data_type", data_type], cwd=work, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    out = work / "train.json"
    r = subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "export", "--format", "xtuner",
                        "--input", "mcts_training_data/textcraft_centric.jsonl",
                        "mcts_training_data/textcraft_good.jsonl", "--output", str(out)],
                       cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def general_data(tmp_path_factory) -> Path:
    """A ShareGPT-style file: 20 usable conversations plus two the loader skips
    (an unknown speaker, no assistant turn)."""
    convs = [{"conversations": [{"from": "human", "value": f"Question {i}: what is {i} plus {i}?"},
                                {"from": "gpt", "value": f"{i} plus {i} is {2 * i}."}]} for i in range(18)]
    convs += [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
                                 {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Bye"},
                                 {"from": "gpt", "value": "Goodbye."}]},
              {"conversations": [{"from": "user", "value": "Name a colour."}, {"from": "assistant", "value": "Red."}]},
              {"conversations": [{"from": "bard", "value": "?"}]},
              {"conversations": [{"from": "human", "value": "unanswered"}]}]
    path = tmp_path_factory.mktemp("general") / "sharegpt.json"
    path.write_text(json.dumps(convs))
    return path
