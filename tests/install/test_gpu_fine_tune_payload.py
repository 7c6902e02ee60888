"""scripts/gpu_fine_tune.sh's `hide` keeps a GPU machine's 64 MiB a call by
untracking the big files the fine-tunes do not read; what they do read (the
base adapter, model_{k-1}'s adapter, the bank's archive with the training rows)
must still travel, and `unhide` must give the index back as it was."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_fine_tune.sh"
BIG = 1_100_000   # past the script's 1 MB line
BANK = "reproduction/smollm2/bank"


def tracked(repo: Path) -> set[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files"], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_hide_keeps_what_the_fine_tunes_read_and_unhide_restores_the_index(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / SCRIPT.name)
    read_there = [f"{BANK}/state.tar.gz",   # the training rows: they grew past 1 MB
                  "models/smollm2-textcraft-base-adapter/adapter_model.safetensors",
                  f"{BANK}/iter_1/model/direct/adapter/adapter_model.safetensors"]
    not_read = [f"{BANK}/iter_1/model/agent-r/adapter/adapter_model.safetensors",
                f"{BANK}/iter_2/model/direct/adapter/adapter_model.safetensors",
                "models/textcraft-base/model.safetensors"]
    for name in read_there + not_read:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\0" * BIG)
    (tmp_path / "small.txt").write_text("travels anyway")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    before = tracked(tmp_path)

    env = {**os.environ, "ITERATIONS": "2", "VARIANTS": "direct"}
    subprocess.run(["bash", "scripts/gpu_fine_tune.sh", "hide"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    hidden = tracked(tmp_path)
    assert set(read_there) <= hidden
    assert not set(not_read) & hidden
    assert "small.txt" in hidden
    untracked = subprocess.run([*git, "ls-files", "--others", "--exclude-standard"], check=True,
                               capture_output=True, text=True).stdout.split()
    assert not set(not_read) & set(untracked), "a hidden file would still travel as an untracked one"

    subprocess.run(["bash", "scripts/gpu_fine_tune.sh", "unhide"], cwd=tmp_path, check=True, capture_output=True)
    assert tracked(tmp_path) == before
    assert subprocess.run([*git, "status", "--porcelain"], check=True, capture_output=True,
                          text=True).stdout == ""
