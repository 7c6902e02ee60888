"""Run manifests: merged across resumed runs, never mistaken for an output."""
from __future__ import annotations

import json

from agent_r.manifest import load_manifest, write_manifest
from tests.support.doubles import ScriptedBackend


def test_manifest_records_run_and_merges_items_across_runs(tmp_path):
    path = tmp_path / "manifest.json"
    backend = ScriptedBackend(lambda m, i, s: "Action: inventory")
    write_manifest(path, {"seed": 3, "task": "textcraft"}, backend, {"done": 1}, 1_700_000_000.0, None,
                   {1: {"leaves": 2}, 10: {"leaves": 1}})
    first = json.loads(path.read_text())
    assert first["seed"] == 3 and first["backend"] == {"backend": "scripted"}
    assert first["finished"] is None and first["started"].startswith("2023-11-14T22:13:20")
    assert first["versions"]["python"] and "torch" in first["versions"]
    write_manifest(path, {"seed": 3}, None, {"done": 1}, 1_700_000_100.0, 1_700_000_200.0,
                   {2: {"leaves": 5}, 1: {"leaves": 3}})
    second = load_manifest(path)
    assert list(second["items"]) == ["1", "2", "10"]  # numeric order, earlier runs kept, newer wins
    assert second["items"]["1"] == {"leaves": 3} and second["items"]["10"] == {"leaves": 1}
    assert second["finished"] and second["backend"] is None


def test_unreadable_manifest_is_replaced(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("{not json")
    assert load_manifest(path) == {}
    write_manifest(path, {}, None, {}, 0.0, 1.0, {5: {}})
    assert load_manifest(path)["items"] == {"5": {}}
