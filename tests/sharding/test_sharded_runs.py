"""Data-parallel runs (docs/cluster.md): N shard processes writing into one
folder produce exactly the files of one unsharded run (search and eval, by
hand and through scripts/launch_shards.sh), and each keeps its own manifest, so
nothing needs coordinating. Real local TextCraft server, the seeded scripted
double (per-request deterministic, like vLLM with per-request seeds)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = "python:tests.support.search_doubles:seeded_textcraft_backend"
SEARCH_ENV = {"TASK": "textcraft", "MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3"}
CLEAN = ("SHARD_INDEX", "NUM_SHARDS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT",
         "GPUS", "GPUS_PER_SHARD", "NODE_SHARD", "NODE_COUNT", "CUDA_VISIBLE_DEVICES")


def script_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return {**env, "PYTHONPATH": str(ROOT), "LOGLEVEL": "WARNING", **extra}


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=script_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{out[-2000:]}\n{err[-3000:]}"
    return out


def result_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("search_results_*.json"))}


# ---------------------------------------------------------------------------- whole runs


def collect_cmd(out: Path, server: str, *flags: str) -> list[str]:
    return [sys.executable, str(ROOT / "mcts_collection.py"), "--env_server_base", server, "--output_dir", str(out),
            "--backend", DOUBLE, "--model_name", "m", "--min", "0", "--max", "14", "--seed", "5", *flags]


def test_three_shard_processes_write_exactly_the_trees_of_one_run(tmp_path, textcraft_server):
    finish(start(collect_cmd(tmp_path / "one", textcraft_server), SEARCH_ENV))
    shards = [start(collect_cmd(tmp_path / "sharded", textcraft_server, "--shard_index", str(i), "--num_shards", "3"),
                    SEARCH_ENV) for i in range(3)]
    for proc in shards:
        finish(proc)

    one, sharded = tmp_path / "one" / "textcraft" / "m", tmp_path / "sharded" / "textcraft" / "m"
    expected = result_files(one)
    assert len(expected) == 11                    # indices 0, 5, 10 are test tasks: never searched
    assert result_files(sharded) == expected      # same files, same bytes

    # manifests: one per shard, never a shared file; their items are disjoint and add up to the run's
    assert not (sharded / "manifest.json").exists()
    manifests = [json.loads((sharded / f"manifest.shard-{i}-of-3.json").read_text()) for i in range(3)]
    keys = [set(m["items"]) for m in manifests]
    assert sum(len(k) for k in keys) == len(set().union(*keys))
    reference = json.loads((one / "manifest.json").read_text())
    assert set().union(*keys) == set(reference["items"])
    assert sum(m["stats"]["done"] for m in manifests) == reference["stats"]["done"] == 11
    assert [m["config"]["shard"]["shard_index"] for m in manifests] == [0, 1, 2]
    assert all(m["finished"] for m in manifests)

    # a rerun of one shard resumes from the shared folder: nothing left, nothing rewritten
    again = finish(start(collect_cmd(tmp_path / "sharded", textcraft_server, "--shard_index", "1",
                                     "--num_shards", "3"), SEARCH_ENV))
    assert "0 done, 4 skipped" in again and result_files(sharded) == expected


def test_launcher_runs_eval_shards_that_match_one_run(tmp_path, textcraft_server):
    """scripts/launch_shards.sh on a 'node' with three devices: three eval
    processes, shards 0..2 of 3, the same result files as one process."""
    env = {"TASK": "textcraft", "MODEL_NAME": "m", "TEMP": "0"}
    args = ["eval.py", "--env_server_base", textcraft_server, "--backend", DOUBLE, "--limit", "7", "--max_steps", "4"]
    finish(start([sys.executable, *args, "--output_dir", str(tmp_path / "one")], env))
    launcher = ["bash", str(ROOT / "scripts" / "launch_shards.sh"), sys.executable, *args,
                "--output_dir", str(tmp_path / "sharded")]
    out = finish(start(launcher, {**env, "GPUS": "a,b,c", "LOG_DIR": str(tmp_path / "logs")}))
    assert out.count("exited 0") == 3 and "shard 2 of 3: GPUs c" in out

    one, sharded = tmp_path / "one" / "textcraft" / "m_eval", tmp_path / "sharded" / "textcraft" / "m_eval"
    assert len(result_files(one)) == 7 and result_files(sharded) == result_files(one)
    items = [json.loads((sharded / f"manifest.shard-{i}-of-3.json").read_text())["items"] for i in range(3)]
    assert [len(i) for i in items] == [3, 2, 2]
    assert set().union(*items) == set(json.loads((one / "manifest.json").read_text())["items"])
    # the summary a final unsharded pass writes (no model or server needed: nothing left) equals one run's
    finish(start([sys.executable, *args, "--output_dir", str(tmp_path / "sharded")], env))
    summary = lambda d: {k: v for k, v in json.loads((d / "summary.json").read_text()).items()  # noqa: E731
                         if k not in ("run_dir", "config", "backend", "backend_stats")}
    assert summary(sharded) == summary(one)
