"""Committed artefacts name models and files by what they are, not by the
machine that made them: no tracked JSON artefact holds an absolute path, and
the rewrite of older files changes paths only (tests/loop/
test_portable_results.py holds the writers)."""
from __future__ import annotations

import subprocess

from scripts import portable_artefacts


def test_no_tracked_artefact_holds_an_absolute_path(capsys):
    assert portable_artefacts.main(["--check"]) == 0, capsys.readouterr().out


def test_a_path_becomes_relative_to_its_run_or_the_repository():
    rewrite = portable_artefacts.rewrite_path
    assert rewrite("/work/runs/smollm2/iter_1/model/agent-r/hf", "smollm2") == "iter_1/model/agent-r/hf"
    assert rewrite("/work/runs/smollm2", "smollm2") == "."
    assert rewrite("/scratch/x/runs/other/iter_1", "smollm2") == "runs/other/iter_1"
    assert rewrite("/home/me/agent-r/models/smollm2-textcraft-base", None) == "models/smollm2-textcraft-base"
    assert rewrite("/opt/llama", None) is None
    unknown: list[str] = []
    text = '{"a": 1.50, "b": "/w/runs/r/x.jsonl,/w/runs/r/y.jsonl", "c": "/", "d": "/opt/llama"}'
    assert portable_artefacts.rewrite_text(text, "r", "f", unknown) == \
        '{"a": 1.50, "b": "x.jsonl,y.jsonl", "c": "/", "d": "/opt/llama"}'
    assert unknown == ["f: /opt/llama"]


def test_the_check_reads_new_files_and_skips_deleted_ones(tmp_path):
    """A bank's new summaries are checked before their commit, and a tracked
    file the bank just removed (a finished fine-tune's checkpoint) is no error."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "run").mkdir()
    for name in ("old.json", "gone.json"):
        (tmp_path / "run" / name).write_text("{}")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (tmp_path / "run" / "gone.json").unlink()
    (tmp_path / "run" / "new.json").write_text("{}")
    (tmp_path / ".gitignore").write_text("ignored.json\n")
    (tmp_path / "run" / "ignored.json").write_text("{}")
    found = portable_artefacts.tracked(["run/*.json"], root=tmp_path)
    assert sorted(p.name for p in found) == ["new.json", "old.json"]


def test_a_manifest_in_an_episode_archive_is_rewritten_in_that_archive(tmp_path):
    """Manifests name the model folder their backend loaded; an episode archive
    is rewritten where it lies, not as a state archive beside it."""
    import tarfile

    from reproduction.pieces import ARCHIVE, packed
    archive = tmp_path / "episodes" / "iter_1" / "eval" / "m_test.tar.gz"
    archive.parent.mkdir(parents=True)
    manifest = '{"backend": {"model_dir": "/scratch/me/models/m"}, "items": {"1": {"env_score": 1.0}}}'
    archive.write_bytes(packed([("manifest.shard-0-of-2.json", manifest.encode()), ("search_results_1.json", b"{}")]))
    unknown: list[str] = []
    assert portable_artefacts.fix_bank(archive, check=True, unknown=unknown)
    assert portable_artefacts.fix_bank(archive, check=False, unknown=unknown) and unknown == []
    with tarfile.open(archive) as tar:
        got = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert got == {"manifest.shard-0-of-2.json": manifest.replace("/scratch/me/models/m", "models/m"),
                   "search_results_1.json": "{}"}
    assert not (archive.parent / ARCHIVE).exists()
    assert not portable_artefacts.fix_bank(archive, check=True, unknown=unknown)
