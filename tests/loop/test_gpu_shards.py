"""The loop over every GPU of a node (agent_r/loop/shards.py): with GPUS=0,1
the search, verifier and eval stages each run as two shard processes (device
ids that do nothing on a CPU) and the run ends with the files and rows of a
one-process run; a shard that fails leaves its stage unfinished, and a rerun
resumes it. Real TextCraft server, a tiny Llama really fine-tuned, the
per-request deterministic policy double of tests/loop/doubles.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.loop import run
from agent_r.loop.shards import gpu_groups, gpu_list
from agent_r.settings import UsageError
from tests.loop.conftest import FLAGS, comparable, settings_for

ONE_ITERATION = {"ITERATIONS": "1", "VARIANTS": "agent-r"}


def files(root: Path, pattern: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob(pattern)) if ".shards" not in p.parts}


def summaries(root: Path) -> dict[str, dict]:
    drop = ("backend_stats", "provenance")   # calls and machines: which process made the episodes
    return {str(p.relative_to(root)): {k: v for k, v in json.loads(p.read_text()).items() if k not in drop}
            for p in sorted(root.rglob("summary.json"))}


def loop_run(env: dict, server: str, runs: Path, name: str, **extra: str):
    return run(settings_for({**env, **ONE_ITERATION, **extra}, FLAGS + ["--env_server_base", server, "--runs_dir",
                                                                         str(runs), "--name", name]))


@pytest.fixture(scope="module")
def one_process(small_env, textcraft_server, tmp_path_factory) -> Path:
    result = loop_run(small_env, textcraft_server, tmp_path_factory.mktemp("runs"), "one")
    assert result.exit_code == 0, result.incomplete
    assert not list(result.root.rglob(".shards"))   # no GPUS: everything in the loop's own process
    return result.root


def test_two_gpu_groups_run_two_shard_processes_per_stage_with_one_process_results(one_process, small_env,
                                                                                   textcraft_server, tmp_path):
    result = loop_run(small_env, textcraft_server, tmp_path, "two", GPUS="0,1")
    assert result.exit_code == 0, result.incomplete
    root = result.root
    for stage in ("iter_1/trees/base", "iter_1/data/agent-r", "iter_0/eval/base", "iter_1/eval/agent-r"):
        logs = sorted(p.name for p in (root / stage / ".shards").glob("*.log"))
        assert len(logs) >= 2 and {n.rsplit("-shard-", 1)[1] for n in logs} >= {"0-of-2.log", "1-of-2.log"}, logs
    # each searched or evaluated folder: a manifest per shard, disjoint items that add up to the run's
    for folder in [*root.glob("iter_1/trees/base/textcraft/*"), *root.glob("iter_*/eval/*/textcraft/*_test")]:
        items = [set(json.loads((folder / f"manifest.shard-{i}-of-2.json").read_text())["items"]) for i in (0, 1)]
        assert items[0] and items[1] and not items[0] & items[1], folder
    # the shards' trees, rows, training file and episodes are one process's, byte for byte
    for pattern in ("search_results_*.json", "*.jsonl", "train.json"):
        assert files(root, pattern) == files(one_process, pattern), pattern
    assert summaries(root) == summaries(one_process)
    rows = lambda r: json.loads((r / "results.json").read_text())["rows"]  # noqa: E731
    assert comparable(rows(root)) == comparable(rows(one_process))


def test_a_failed_shard_leaves_the_stage_unfinished_and_a_rerun_resumes_it(one_process, small_env, textcraft_server,
                                                                          tmp_path):
    """The base eval's shards die at start (a file stands where their
    episodes go): the run names the failed shards and their logs and stops
    there, unfinished; once the path is free, the same command resumes and
    ends with the one-process results."""
    blocker = tmp_path / "two" / "iter_0" / "eval" / "base" / "textcraft"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    first = loop_run(small_env, textcraft_server, tmp_path, "two", GPUS="0,1")
    assert first.exit_code == 1 and "shards failed" in first.incomplete and "log " in first.incomplete
    assert not (tmp_path / "two" / "iter_0" / "eval" / "base" / ".done.json").exists()
    blocker.unlink()
    again = loop_run(small_env, textcraft_server, tmp_path, "two", GPUS="0,1")
    assert again.exit_code == 0, again.incomplete
    assert files(again.root, "search_results_*.json") == files(one_process, "search_results_*.json")


def test_gpu_groups_follow_gpus_then_cuda_visible_devices_and_the_tensor_parallel_size():
    assert gpu_list("0,1", {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == ["0", "1"]
    assert gpu_list("", {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["4", "5", "6", "7"]
    assert gpu_groups(["4", "5", "6", "7"], 2) == ["4,5", "6,7"]
    assert gpu_groups(["0"], 1) == ["0"]
    with pytest.raises(UsageError, match="do not split into groups of --tensor_parallel_size 2"):
        gpu_groups(["0", "1", "2"], 2)
