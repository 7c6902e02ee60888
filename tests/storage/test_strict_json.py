"""Strict JSON in and out: no NaN or Infinity is ever written (the refusal
names where the value sits), a lone surrogate is written as its escape, and
a corrupt file is named when read."""
from __future__ import annotations

import json
import math

import pytest

from agent_r import io


def test_jsonl_rows_keep_a_lone_surrogate_as_an_escape(tmp_path):
    """A model's lone surrogate inside a row cannot be UTF-8: it is written
    as its \\uXXXX escape (valid JSON) and reads back as the same string."""
    path = tmp_path / "rows.jsonl"
    rows = [{"turn": "odd \ud800 reply"}, {"turn": "plain"}]
    io.atomic_write_jsonl(path, rows)
    text = path.read_text(encoding="utf-8")
    assert "\\ud800" in text and [json.loads(line) for line in text.splitlines()] == rows


def test_non_finite_values_are_named_by_their_json_path():
    """NaN and Infinity are refused before writing, naming the file, row and JSON path."""
    with pytest.raises(ValueError, match=r"rows\.jsonl row 2: \$\['a'\]\[1\] = inf"):
        io.atomic_write_jsonl("/nonexistent/rows.jsonl", [{"a": [1.0]}, {"a": [0.0, math.inf]}])
    assert io.first_non_finite({"x": [1.0, {"y": -math.inf}]}) == "$['x'][1]['y'] = -inf"
    assert io.first_non_finite([1.0, "nan", {"k": 2}]) is None


def test_corrupt_json_is_named_by_its_file(tmp_path):
    """read_json names the file of corrupt JSON; UTF-8 text reads back as written."""
    path = tmp_path / "summary.json"
    path.write_text('{"tasks": 3,', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}: corrupt JSON \("):
        io.read_json(path)
    path.write_text('{"note": "caf\u00e9 \u2615"}', encoding="utf-8")
    assert io.read_json(path) == {"note": "caf\u00e9 \u2615"}
