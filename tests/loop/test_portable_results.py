"""A loop run made in one folder names its models, data and eval summaries
exactly as the same run made in another: paths relative to the run (or the
repository), the model also by its weights' sha256."""
from __future__ import annotations

import json
from pathlib import Path

from agent_r.loop import run
from tests.loop.conftest import FLAGS, settings_for


def run_files(root: Path) -> dict[str, object]:
    """results.json without wall times and the run's location, and every eval summary."""
    results = json.loads((root / "results.json").read_text())
    del results["config"]["runs_dir"]
    for row in results["rows"]:
        row.pop("seconds")
        (row.get("train") or {}).pop("seconds", None)
    summaries = {str(p.relative_to(root)): json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))}
    for s in summaries.values():
        s.pop("backend_stats", None)
    return {"results": results, **summaries}


def test_a_run_made_in_two_folders_names_its_models_and_data_alike(small_env, textcraft_server, tmp_path):
    env = {**small_env, "ITERATIONS": "1", "VARIANTS": "agent-r"}
    got = []
    for where in ("one", "two"):
        flags = FLAGS + ["--runs_dir", str(tmp_path / where), "--name", "r", "--env_server_base", textcraft_server]
        assert run(settings_for(env, flags)).exit_code == 0
        got.append(run_files(tmp_path / where / "r"))
    assert got[0] == got[1]
    text = json.dumps(got[0])
    assert str(tmp_path) not in text and '"iter_1/model/agent-r/hf"' in text
    assert got[0]["results"]["rows"][1]["model_sha256"]                    # what model_1 is, wherever it lies
