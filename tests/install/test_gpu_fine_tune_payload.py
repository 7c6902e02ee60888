"""scripts/gpu_fine_tune.sh gets a GPU machine what a stage there reads
through calls of at most 64 MiB: `hide` stops the tracked files over 1 MB
from travelling, `prepare` packs what the stage reads (the model wheel, the
hidden files it needs) into parts that fit beside the rest, `deposit` keeps
each part there and `gather` joins them in the last call. Here a fresh
folder plays the machine (it gets what one call carries, nothing more), with
a call of a few MiB instead of 64: the hidden files the stage reads must
come back byte for byte, the others must stay here, and `unhide` must give
the index back as it was. The GPU half (de-quantizing, the stage) is not
run here: it needs the GPU image."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_fine_tune.sh"
BIG = 1_100_000   # past the script's 1 MB line
BANK = "reproduction/smollm2/bank"
BASE = "models/smollm2-textcraft-base"


def tracked(repo: Path) -> set[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files"], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def what_travels(repo: Path, carried: str, machine: Path) -> None:
    """A call's copy of the repository: tracked and untracked-not-ignored files, and the carried folder."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True, text=True).stdout.split()
    for name in [*listed, *(str(p.relative_to(repo)) for p in (repo / carried).rglob("*") if p.is_file())]:
        (machine / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / name, machine / name)


def test_the_payload_goes_in_parts_and_the_last_call_gets_back_the_hidden_files_it_reads(tmp_path):
    repo, there = tmp_path / "repo", tmp_path / "machine"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / SCRIPT.name)
    shutil.copy(ROOT / "scripts" / "gpu_base_sweep.py", repo / "scripts")   # tensor_hashes
    subprocess.run([*git, "init", "-q"], check=True)
    read_there = [f"{BANK}/state.tar.gz", "models/smollm2-textcraft-base-adapter/adapter_model.safetensors",
                  *(f"{BANK}/iter_{j}/model/{v}/adapter/adapter_model.safetensors" for j in (1, 2)
                    for v in ("agent-r", "direct")),
                  # the current iteration's banked step checkpoint: the fine-tune there resumes, not starts over
                  f"{BANK}/iter_3/model/agent-r/checkpoint/trained.safetensors"]
    not_read = [f"{BANK}/iter_1/model/good/adapter/adapter_model.safetensors", "models/textcraft-base/model.safetensors",
                f"{BANK}/iter_2/model/direct/checkpoint/trained.safetensors"]   # an earlier iteration's
    for i, name in enumerate(read_there + not_read):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(os.urandom(BIG - i))
    (repo / "small.txt").write_text("travels anyway")
    (repo / ".gitignore").write_text("/models/.cache/\n/models/smollm2-135m-instruct/\n/runs/\n" + f"/{BASE}/\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    before = tracked(repo)
    # what prepare packs besides: the model wheel (a stand-in), the base's small files, the general data
    (repo / "models/.cache").mkdir(parents=True)
    (repo / "models/.cache/smollm2.whl").write_bytes(os.urandom(3 * BIG))
    for folder in ("models/smollm2-135m-instruct", BASE):
        (repo / folder).mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(repo / folder / "model.safetensors"))
    for name in ("base_provenance.json", "config.json", "generation_config.json", "special_tokens_map.json",
                 "tokenizer.json", "tokenizer_config.json", "training_tasks.json"):
        (repo / BASE / name).write_text("{}")
    (repo / "runs/smollm2/general_data").mkdir(parents=True)
    for name in ("policy.json", "verifier_all.json"):
        (repo / "runs/smollm2/general_data" / name).write_text("[]")

    env = {**os.environ, "ITERATIONS": "3", "VARIANTS": "agent-r,direct", "WHEEL": "models/.cache/smollm2.whl",
           "WHEELS": "", "PYTHON": str(ROOT / ".venv/bin/python"), "PYTHONPATH": str(repo),
           "CALL_BYTES": str(3 * BIG), "MARGIN": "0", "GPU_TMP": str(tmp_path / "tmp_there")}
    def bash(*args: str, cwd: Path = repo) -> str:
        done = subprocess.run(["bash", "scripts/gpu_fine_tune.sh", *args], cwd=cwd, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    bash("hide")
    assert tracked(repo) == before - set(read_there) - set(not_read)
    said = bash("prepare")
    calls = sorted((p.name for p in repo.glob(".gpu*")), key=lambda name: int(name[4:]))
    assert len(calls) >= 3 and f"{len(calls)} parts" in said, said
    small = sum((repo / name).stat().st_size for name in tracked(repo))
    for folder in calls:   # each call fits: the repository's small files, the untracked ones, its part
        there_now = tmp_path / f"call-{folder}"
        what_travels(repo, folder, there_now)
        assert sum(p.stat().st_size for p in there_now.rglob("*") if p.is_file()) <= 3 * BIG, folder
        assert not any((there_now / name).exists() for name in read_there + not_read), folder
        assert small <= 3 * BIG

    for folder in calls[:-1]:   # one warm machine: each call a fresh copy of the tree, /tmp kept
        shutil.rmtree(there, ignore_errors=True)
        what_travels(repo, folder, there)
        bash("deposit", cwd=there)
    shutil.rmtree(there)
    what_travels(repo, calls[-1], there)
    bash("gather", cwd=there)
    for name in read_there:
        assert (there / name).read_bytes() == (repo / name).read_bytes(), name
    assert not any((there / name).exists() for name in not_read)
    payload = tmp_path / "tmp_there" / "gpu" / "payload"
    assert (payload / "smollm2.whl").read_bytes() == (repo / "models/.cache/smollm2.whl").read_bytes()
    assert (payload / "base_sha").read_text().strip() and (payload / "general" / "policy.json").exists()

    (there / calls[-1] / "part.99").write_bytes(b"x")   # a part too many: refused with one line
    wrong = subprocess.run(["bash", "scripts/gpu_fine_tune.sh", "gather"], cwd=there, env=env, capture_output=True,
                           text=True)
    assert wrong.returncode == 4 and "payload parts" in wrong.stderr, wrong.stderr

    bash("unhide")
    assert tracked(repo) == before
    assert subprocess.run([*git, "status", "--porcelain"], check=True, capture_output=True,
                          text=True).stdout == ""
