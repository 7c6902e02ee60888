"""What a resumed eval keeps: a rerun with nothing left to play loads no
model, yet its summary keeps the backend and the call statistics the earlier
invocations recorded; and a shard's manifest, completed from episode files a
killed invocation left unrecorded, takes only that shard's own episodes,
never another shard's in the same folder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.env_fixtures import ROOT
from tests.support.faults import script_env

TINY = ROOT / "models" / "textcraft-tiny"


def eval_run(cwd: Path, server: str, *args) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "eval.py"), "--env_server_base", server, "--output_dir",
                          str(cwd / "out"), "--max_steps", "2", "--limit", "4", *map(str, args)], cwd=cwd,
                         env=script_env({"TASK": "textcraft", "MODEL_DIR": str(TINY), "BACKEND": "hf", "TEMP": "0"}),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_rerun_with_nothing_left_keeps_the_backend_statistics(tmp_path, textcraft_server):
    eval_run(tmp_path, textcraft_server)
    run_dir = tmp_path / "out" / "textcraft" / "textcraft-tiny_eval"
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["backend_stats"]["calls"] > 0
    eval_run(tmp_path, textcraft_server)                   # nothing left: no model loaded
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["backend_stats"] == first["backend_stats"] and again["backend"] == first["backend"]
    assert again["provenance"]["dtype"] == first["provenance"]["dtype"] != "unknown"


def test_a_shards_manifest_recovers_only_its_own_episodes(tmp_path, textcraft_server):
    for shard in (0, 1):
        eval_run(tmp_path, textcraft_server, "--shard_index", shard, "--num_shards", 2)
    run_dir = tmp_path / "out" / "textcraft" / "textcraft-tiny_eval"
    manifests = {i: run_dir / f"manifest.shard-{i}-of-2.json" for i in (0, 1)}
    own = {i: set(json.loads(m.read_text())["items"]) for i, m in manifests.items()}
    assert own[0] and own[1] and not own[0] & own[1]
    lost = json.loads(manifests[0].read_text())
    lost["items"] = {}                                      # a killed invocation recorded none of its episodes
    manifests[0].write_text(json.dumps(lost))
    eval_run(tmp_path, textcraft_server, "--shard_index", 0, "--num_shards", 2)
    recovered = json.loads(manifests[0].read_text())["items"]
    assert set(recovered) == own[0] and all(v.get("recovered") for v in recovered.values())
