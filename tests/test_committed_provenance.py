"""Every eval summary and results.json row the repository commits says what
made its numbers: the provenance fields every summary is written with
(agent_r.provenance.PROVENANCE_FIELDS), ``unknown`` where nothing recorded
one. A committed summary without them fails here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.provenance import PROVENANCE_FIELDS
from tests.support.env_fixtures import ROOT

COMMITTED = ROOT / "reproduction"
SUMMARIES = sorted(p for p in COMMITTED.glob("*/**/summary.json") if "bank" not in p.parts) + \
    sorted(COMMITTED.glob("*/passk/*.json"))
RESULTS = sorted(COMMITTED.glob("*/results*.json"))


def missing(provenance: object) -> list[str]:
    if not isinstance(provenance, dict):
        return ["provenance"]
    return [f for f in PROVENANCE_FIELDS if provenance.get(f) in (None, "", [], {})]


def test_the_committed_files_are_found():
    assert len(SUMMARIES) > 60 and len(RESULTS) >= 2


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: str(p.relative_to(COMMITTED)))
def test_every_committed_summary_records_its_provenance(path: Path):
    assert not missing(json.loads(path.read_text()).get("provenance"))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.relative_to(COMMITTED)))
def test_every_results_row_records_its_weights_and_each_evals_provenance(path: Path):
    if "pairs_file" in json.loads(path.read_text()):     # reproduction/pair_table.py's: two evals a row
        for row in json.loads(path.read_text())["rows"]:
            for half in ("reference_figures", "other_figures"):
                assert "pending" in row or not missing(row[half].get("provenance")), (row["model"], row["eval"], half)
        return
    for row in json.loads(path.read_text())["rows"]:
        assert row.get("model_sha256"), (row["iteration"], row["variant"])
        for part in ("test", "revise_task"):
            for task, stats in (row.get(part) or {}).items():
                assert not missing(stats.get("provenance")), (row["iteration"], row["variant"], part, task)


def test_a_summary_without_provenance_is_caught():
    assert missing(None) == ["provenance"]
    assert missing({"model_sha256": "x", "backend": "vllm", "dtype": "bfloat16", "machines": [], "commits": ["c"],
                    "settings": {}}) == ["machines", "settings"]
