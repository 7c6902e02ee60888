"""The one-command demo (scripts/demo.sh: one short iterate.py iteration), shortened:
two train tasks, a short search and three test tasks. Real server process, real
bundled model (hf)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from scripts.demo_summary import summarize

ROOT = Path(__file__).resolve().parents[2]


def test_demo_makes_trees_revision_data_and_a_score(tmp_path):
    """scripts/demo.sh exits 0 with trees, revision samples, an XTuner export
    with both loss flags, scores of both iterations, results.md/png, a viewer
    page per tree, and the server stopped by its trap."""
    env = dict(os.environ, PY=sys.executable, SKIP_SETUP="1", DEMO_OUT=str(tmp_path / "demo"),
               DEMO_MIN="1", DEMO_MAX="3", ITERA="3", N_GEN="4", DEMO_EVAL_LIMIT="3",
               BACKEND="hf", LOGLEVEL="WARNING")
    for var in ("MODEL_DIR", "MODEL_NAME", "TASK", "TEMP"):
        env.pop(var, None)
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "demo" / "demo"          # iterate.py --runs_dir DEMO_OUT --name demo
    s = summarize(run)
    assert s["trees"] == 2
    assert s["successful_leaves"] >= 1
    assert s["revision_samples"] >= 1 and s["xtuner_samples"] >= s["revision_samples"]
    assert {(it, n) for it, _variant, _task, n, _success, _score in s["scores"]} == {(0, 3), (1, 3)}
    assert "revision samples:" in proc.stdout and "score x100" in proc.stdout
    assert (run / "results.md").exists() and (run / "results.png").exists()
    # viewer pages of the searched trees, one per tree, revision pairs matched to them
    pages = list((run / "viewer").rglob("search_results_*.html"))
    assert (run / "viewer" / "index.html").exists() and len(pages) == s["trees"]
    assert f"{run}/viewer/index.html" in proc.stdout and "revision pairs shown:" in proc.stdout
    # the exported samples carry explicit loss flags, the bad prefix untrained
    rows = json.loads(next((run / "iter_1" / "data").glob("*/train.json")).read_text())
    flags = [m["loss"] for r in rows for m in r["messages"] if m["role"] == "assistant" and "loss" in m]
    assert True in flags and False in flags
    # the server was stopped by the trap
    assert "textcraft server on" in (tmp_path / "demo" / "textcraft_server.log").read_text()
