"""Atomic writes: a failure at any point before the rename - while writing,
syncing or renaming - leaves the previous file exactly as it was and no temp
file behind; the temp file sits hidden beside its target, and the result has
the umask's permissions. In-process faults (monkeypatched os calls);
tests/cli/test_kills.py kills real runs between the temp file and the rename."""
from __future__ import annotations

import json
import math
import os

import pytest

from agent_r import io
from agent_r.io import atomic_write_json, atomic_write_text

OLD = {"visits": 1, "value": 0.5, "note": "the previous run's file"}
NEW = {"visits": 2, "value": 1.0, "note": "x" * 100_000}


@pytest.fixture
def previous(tmp_path):
    """A tree file written by an earlier run: (its path, its bytes)."""
    path = tmp_path / "out" / "search_results_1.json"
    io.atomic_write_json(path, OLD)
    return path, path.read_bytes()


def assert_untouched(path, before: bytes) -> None:
    """The previous bytes are there, and nothing else in the folder."""
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name], "a temp file was left behind"


def test_write_succeeds_and_replaces_whole(previous):
    """A write replaces the whole file and leaves no temp file."""
    path, _ = previous
    io.atomic_write_json(path, NEW)
    assert json.loads(path.read_text()) == NEW
    assert sorted(os.listdir(path.parent)) == [path.name]


@pytest.mark.parametrize("where", ["replace", "fsync", "write"])
def test_failure_before_the_rename_leaves_the_previous_file(previous, monkeypatch, where):
    """A full disk while writing, syncing or renaming leaves the previous file and no temp file."""
    path, before = previous
    calls = []

    def boom(*args, **kwargs):
        calls.append(where)
        raise OSError(28, f"No space left on device (injected in {where})")

    if where == "replace":
        monkeypatch.setattr(io.os, "replace", boom)
    elif where == "fsync":
        monkeypatch.setattr(io.os, "fsync", boom)
    else:   # the file object's write fails part-way: a short, then failing write
        real_fdopen = io.os.fdopen

        class Failing:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, text):
                self.f.write(text[: len(text) // 2])
                self.f.flush()
                boom()

            def __getattr__(self, name):
                return getattr(self.f, name)

        monkeypatch.setattr(io.os, "fdopen", lambda *a, **k: Failing(real_fdopen(*a, **k)))
    with pytest.raises(OSError, match="injected"):
        io.atomic_write_json(path, NEW)
    assert calls == [where]                  # the fault was really hit on the way to the file
    assert_untouched(path, before)


def test_jsonl_failure_before_the_rename_leaves_the_previous_file(tmp_path, monkeypatch):
    """The same for JSONL: a failed rename leaves the previous rows."""
    path = tmp_path / "textcraft_centric.jsonl"
    io.atomic_write_jsonl(path, [{"a": 1}, {"b": 2}])
    before = path.read_bytes()
    monkeypatch.setattr(io.os, "replace", lambda *a, **k: (_ for _ in ()).throw(OSError("injected")))
    with pytest.raises(OSError, match="injected"):
        io.atomic_write_jsonl(path, [{"c": 3}])
    assert_untouched(path, before)


def test_unwritable_value_leaves_the_previous_file(previous):
    """A NaN is refused before any byte is written (strict JSON), naming where
    it sits; the previous file stays."""
    path, before = previous
    with pytest.raises(ValueError, match=r"\$\['children'\]\[0\]\['value'\] = nan"):
        io.atomic_write_json(path, {"children": [{"value": math.nan}]})
    assert_untouched(path, before)


def test_interrupt_mid_write_leaves_the_previous_file(previous, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) between the write and the rename, too."""
    path, before = previous

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(io.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        io.atomic_write_json(path, NEW)
    assert_untouched(path, before)


def test_atomic_write_uses_umask_permissions(tmp_path):
    """Under umask 022 the file is 0644, as a plain open() would make it, and no temp file is left."""
    import os
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "p.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temp file left


def test_atomic_write_keeps_its_temp_file_hidden_beside_the_target(tmp_path, monkeypatch):
    """The temp file lives in the target's folder (a rename across file
    systems is not atomic) under a dot name no output glob matches."""
    seen = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append((src, dst)), real(src, dst))[1])
    target = tmp_path / "search_results_3.json"
    atomic_write_text(target, "ü\n")
    ((src, dst),) = seen
    src = os.fspath(src)
    assert os.path.dirname(src) == str(tmp_path) and os.fspath(dst) == str(target)
    name = os.path.basename(src)
    assert name.startswith(".search_results_3.json.") and name.endswith(".tmp")
    assert target.read_bytes() == "ü\n".encode("utf-8") and list(tmp_path.iterdir()) == [target]
