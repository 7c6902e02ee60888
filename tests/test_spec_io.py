"""Atomic writes (SPEC section 7: "non-atomic writes" fixed): a failure at any
point before the rename - while writing, syncing or renaming - leaves the
previous file exactly as it was and no temp file behind. In-process faults
(monkeypatched os calls); tests/test_faults_kill.py kills real runs between
the temp file and the rename."""
from __future__ import annotations

import json
import math
import os

import pytest

from agent_r import io

OLD = {"visits": 1, "value": 0.5, "note": "the previous run's file"}
NEW = {"visits": 2, "value": 1.0, "note": "x" * 100_000}


@pytest.fixture
def previous(tmp_path):
    path = tmp_path / "out" / "search_results_1.json"
    io.atomic_write_json(path, OLD)
    return path, path.read_bytes()


def assert_untouched(path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name], "a temp file was left behind"


def test_write_succeeds_and_replaces_whole(previous):
    path, _ = previous
    io.atomic_write_json(path, NEW)
    assert json.loads(path.read_text()) == NEW
    assert sorted(os.listdir(path.parent)) == [path.name]


@pytest.mark.parametrize("where", ["replace", "fsync", "write"])
def test_failure_before_the_rename_leaves_the_previous_file(previous, monkeypatch, where):
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


def test_jsonl_rows_keep_a_lone_surrogate_as_an_escape(tmp_path):
    """A model's lone surrogate inside a row cannot be UTF-8: it is written
    as its \\uXXXX escape (valid JSON) and reads back as the same string."""
    path = tmp_path / "rows.jsonl"
    rows = [{"turn": "odd \ud800 reply"}, {"turn": "plain"}]
    io.atomic_write_jsonl(path, rows)
    text = path.read_text(encoding="utf-8")
    assert "\\ud800" in text and [json.loads(line) for line in text.splitlines()] == rows


def test_non_finite_values_are_named_by_their_json_path():
    with pytest.raises(ValueError, match=r"rows\.jsonl row 2: \$\['a'\]\[1\] = inf"):
        io.atomic_write_jsonl("/nonexistent/rows.jsonl", [{"a": [1.0]}, {"a": [0.0, math.inf]}])
    assert io.first_non_finite({"x": [1.0, {"y": -math.inf}]}) == "$['x'][1]['y'] = -inf"
    assert io.first_non_finite([1.0, "nan", {"k": 2}]) is None


def test_corrupt_json_is_named_by_its_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"tasks": 3,', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}: corrupt JSON \("):
        io.read_json(path)
    path.write_text('{"note": "caf\u00e9 \u2615"}', encoding="utf-8")
    assert io.read_json(path) == {"note": "caf\u00e9 \u2615"}
