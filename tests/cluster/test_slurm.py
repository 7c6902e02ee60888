"""Every cluster command under a real SLURM (slurmctld + slurmd on
127.0.0.1): the committed sbatch scripts of slurm/ submitted as a cluster
user submits them, with CPU settings, the tiny Llama and the per-request
deterministic policy double, so every output can be compared byte for byte
with a one-process run.

* search.sbatch as an array of 3; one array task cancelled with scancel
  while it is held mid-search; the same array resubmitted finishes the run
  with the trees of one process;
* path_collection.sbatch after it (--dependency=afterok) writes the rows and
  training file of one process;
* eval.sbatch as an array of 2 and its final unsharded pass: the episodes
  and summary of one process;
* loop.sbatch: iterate.py on one node with GPUS=0,1 ends with the rows of
  a one-process loop;
* train.sbatch on one node (here: one node of the test cluster) trains and
  converts, and the model loads.
What this cluster cannot show: several hosts, real GPUs, vLLM on a GPU, an
8B model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig
from agent_r.loop import run
from tests.cluster.doubles import DOUBLE
from tests.loop.conftest import FLAGS, SMALL, comparable, settings_for
from tests.support.model_fixtures import build_tiny_model, free_port
from tests.training.conftest import CPU_CONFIG, SUPPORT, TRAIN_VENV, train_env

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "slurm"
SMALL_JOB = ["--cpus-per-task=1", "--mem=1G", "--time=30"]
SEARCH = {"MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3", "TEMP": "1.0", "MODEL_NAME": "m"}
# settings a cluster user would not have set: cleared so the caller's shell cannot leak in
CLEAR = ("SHARD_INDEX", "NUM_SHARDS", "GPUS", "CUDA_VISIBLE_DEVICES", "MODEL_TYPE", "ENV_SERVER", "SEARCH_DIR",
         "DATA_DIR", "EVAL_DIR", "REPO", "VENV", "CI_HOLD")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("cluster_model") / "model", seed=3)


def job_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    return {**env, "PYTHONPATH": str(ROOT), "LOGLEVEL": "INFO", "REPO": str(ROOT), "BACKEND": DOUBLE,
            "TASK": "textcraft", **{k: str(v) for k, v in extra.items()}}


def one_process(script: str, env: dict, cwd: Path, *args: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{script} {args}: {r.stderr[-3000:]}"


def files(folder: Path, pattern: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob(pattern))}


def logs(folder: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.glob("*.out")))


def test_search_array_survives_a_cancelled_task_then_data_and_eval_match_one_process(slurm, model, textcraft_server,
                                                                                  tmp_path):
    base = job_env(MODEL_DIR=model, **SEARCH)
    out = tmp_path / "logs"
    out.mkdir()
    bounds = "--min 0 --max 15 --concurrency 1"   # 12 train tasks (0, 5, 10 are test tasks)

    # one process, the reference
    one = tmp_path / "one"
    one_process("mcts_collection.py", base, tmp_path, "--env_server_base", textcraft_server, "--output_dir",
                str(one / "trees"), "--seed", "0", *bounds.split())
    one_process("path_collection.py", base, tmp_path, "--input_dir", str(one / "trees"), "--output_dir",
                str(one / "data"), "--data_type", "centric")
    one_process("path_collection.py", base, tmp_path, "--input_dir", str(one / "trees"), "--output_dir",
                str(one / "data"), "--data_type", "good")
    one_process("path_collection.py", base, tmp_path, "export", "--format", "xtuner", "--input",
                str(one / "data" / "textcraft_centric.jsonl"), str(one / "data" / "textcraft_good.jsonl"),
                "--output", str(one / "data" / "train.json"))
    eval_flags = ["--limit", "6", "--max_steps", "4"]
    one_process("eval.py", {**base, "MODEL_TYPE": "test", "TEMP": "0"}, tmp_path, "--env_server_base",
                textcraft_server, "--output_dir", str(one / "eval"), *eval_flags)

    # the search array, task 1 held mid-search and cancelled
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    sharded = tmp_path / "sharded"
    search_env = {**base, "SEARCH_DIR": str(sharded / "trees"), "SEARCH_ARGS": bounds, "CLUSTER_GATE": str(gate),
                  "CLUSTER_HOLD_TASK": "1"}
    options = [*SMALL_JOB, "--array=0-2", f"--output={out}/search-%A_%a.out"]
    first = slurm.sbatch(SLURM / "search.sbatch", *options, cwd=tmp_path, env=search_env)
    slurm.wait_for_file(gate / "reached", first, out)
    slurm.run("scancel", f"{first}_1")
    states = slurm.wait(first)
    assert states == {f"{first}_0": "COMPLETED", f"{first}_1": "CANCELLED", f"{first}_2": "COMPLETED"}, logs(out)
    trees = sharded / "trees" / "textcraft" / "m"
    assert 0 < len(files(trees, "search_results_*.json")) < 12   # cancelled mid-run: shard 1's share unfinished

    # the same array again, then the data job after it
    (gate / "hold").unlink()
    again = slurm.sbatch(SLURM / "search.sbatch", *options, cwd=tmp_path, env=search_env)
    data = slurm.sbatch(SLURM / "path_collection.sbatch", *SMALL_JOB, f"--dependency=afterok:{again}",
                        f"--output={out}/data-%j.out", cwd=tmp_path,
                        env={**base, "SEARCH_DIR": str(sharded / "trees"), "DATA_DIR": str(sharded / "data")})
    assert set(slurm.wait(again).values()) == {"COMPLETED"}, logs(out)
    assert set(slurm.wait(data).values()) == {"COMPLETED"}, logs(out)
    assert files(trees, "search_results_*.json") == files(one / "trees" / "textcraft" / "m", "search_results_*.json")
    assert len(files(trees, "search_results_*.json")) == 12
    assert [json.loads((trees / f"manifest.shard-{i}-of-3.json").read_text())["finished"] for i in range(3)]
    assert files(sharded / "data", "*.jsonl") == files(one / "data", "*.jsonl")
    assert files(sharded / "data", "train.json") == files(one / "data", "train.json")

    # eval: an array of two shards, then the unsharded pass that writes the summary
    eval_env = {**base, "MODEL_TYPE": "test", "TEMP": "0", "EVAL_DIR": str(sharded / "eval"),
                "EVAL_ARGS": " ".join(eval_flags)}
    shards = slurm.sbatch(SLURM / "eval.sbatch", *SMALL_JOB, "--array=0-1", f"--output={out}/eval-%A_%a.out",
                          cwd=tmp_path, env=eval_env)
    final = slurm.sbatch(SLURM / "eval.sbatch", *SMALL_JOB, "--array=0", f"--dependency=afterok:{shards}",
                         f"--output={out}/eval-final-%A.out", cwd=tmp_path,
                         env={**eval_env, "SHARD_INDEX": "0", "NUM_SHARDS": "1"})
    assert set(slurm.wait(shards).values()) == {"COMPLETED"}, logs(out)
    assert set(slurm.wait(final).values()) == {"COMPLETED"}, logs(out)
    got, want = sharded / "eval" / "textcraft" / "m_test", one / "eval" / "textcraft" / "m_test"
    assert files(got, "search_results_*.json") == files(want, "search_results_*.json") != {}
    drop = ("run_dir", "config", "backend_stats", "provenance")
    summary = lambda d: {k: v for k, v in json.loads((d / "summary.json").read_text()).items()  # noqa: E731
                         if k not in drop}
    assert summary(got) == summary(want)


def test_loop_sbatch_runs_the_loop_over_two_gpu_groups_with_one_process_results(slurm, model, textcraft_server,
                                                                                 tmp_path):
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": model, "ITERATIONS": "1", "VARIANTS": "agent-r"}
    reference = run(settings_for(env, FLAGS + ["--env_server_base", textcraft_server, "--runs_dir",
                                               str(tmp_path / "one"), "--name", "loop"]))
    assert reference.exit_code == 0, reference.incomplete
    out = tmp_path / "logs"
    out.mkdir()
    job = slurm.sbatch(SLURM / "loop.sbatch", "--cpus-per-task=2", "--mem=2G", "--time=30", "--gpus-per-node=2",
                       f"--output={out}/loop-%j.out", cwd=tmp_path,
                       env=job_env(**env, GPUS="0,1", NAME="loop",
                                   LOOP_ARGS=" ".join(FLAGS + ["--runs_dir", str(tmp_path / "slurm")])))
    assert set(slurm.wait(job).values()) == {"COMPLETED"}, logs(out)
    root = tmp_path / "slurm" / "loop"
    assert len(list((root / "iter_1" / "trees" / "base" / ".shards").glob("*.log"))) == 2   # two shard processes
    rows = lambda r: json.loads((r / "results.json").read_text())["rows"]  # noqa: E731
    assert comparable(rows(root)) == comparable(rows(reference.root))


def test_train_sbatch_fine_tunes_and_converts_on_one_node(slurm, agent_export, tiny_model_dir, tmp_path):
    if not (TRAIN_VENV / "bin" / "python").exists():
        pytest.fail("the training environment .venv-train is missing: run `make setup-train`", pytrace=False)
    out, work = tmp_path / "logs", tmp_path / "work"
    out.mkdir()
    env = {**train_env(CONFIG=CPU_CONFIG, DEEPSPEED=SUPPORT / "deepspeed_zero2_cpu.json", MODEL_DIR=tiny_model_dir,
                       DATA_FILES=agent_export, WORK_DIR=work, HF_DIR=tmp_path / "hf", MAX_LENGTH=512, EPOCHS=1,
                       LR=2e-3, ACCUMULATIVE_COUNTS=1, WARMUP_RATIO=0, SAVE_FP32=1, PORT=free_port(),
                       TRAIN_VENV=TRAIN_VENV, REPO=ROOT)}
    job = slurm.sbatch(SLURM / "train.sbatch", "--nodes=1", "--gpus-per-node=1", *SMALL_JOB,
                       f"--output={out}/train-%j.out", cwd=tmp_path, env=env)
    assert set(slurm.wait(job).values()) == {"COMPLETED"}, logs(out)
    assert f"next iteration: export MODEL_DIR={tmp_path / 'hf'}" in logs(out)
    backend = HFBackend(str(tmp_path / "hf"), device="cpu")
    try:
        msgs = [{"role": "user", "content": "Goal: craft stick."}]
        got = backend.generate([GenerationRequest(msgs, n=1)], SamplingConfig(temperature=0.0, max_new_tokens=4))
        assert isinstance(got[0][0], str)
    finally:
        backend.close()
