"""Model-endpoint faults: the three scripts with ``--backend openai`` (the real
openai client) against the local OpenAI-compatible test server, which serves a
scripted policy table (a test double, not a model) and injects faults.

* 20% faults (429 / 500 / hang past the client timeout): every run completes,
  its outputs equal a fault-free run's, and the retries are logged, printed
  and recorded in the manifest.
* 100% faults or a rejected key: the run stops with one clear error line after
  the bound, exit 2.
* A planted API key never appears in stdout, stderr or any file written.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import tree_fixtures as tf
from tests.support.env_fixtures import start_server, stop_server
from tests.support.faults import TABLE, files, run_script

KEY = "sk-planted-4f1d9c2b7e6a5d3c"
SEARCH_TABLE = {"Inventory: You are not": ["Thought: get wood.\nAction: get 1 oak logs",
                                           "Thought: craft.\nAction: craft 4 oak planks using 1 oak logs"],
                "default": ["Thought: look.\nAction: inventory", "Thought: wood.\nAction: get 1 oak logs"]}
VERIFIER_TABLE = {"(step 2)": ["The step wastes a move.\nJudgment: Bad"],
                  "default": ["The step is fine.\nJudgment: Good"]}


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tables")
    out = {}
    for name, table in (("search", SEARCH_TABLE), ("verifier", VERIFIER_TABLE)):
        out[name] = d / f"{name}.json"
        out[name].write_text(json.dumps(table))
    return out


def model_server(table: Path, *flags: str):
    return start_server("tests.support.openai_server", "--policy-json", str(table), "--model-name", "scripted",
                        "--api-key", KEY, "--hang-seconds", "30", *flags)


def openai_env(url: str, **extra) -> dict:
    return {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": KEY, "MODEL_NAME": "scripted",
            "OPENAI_TIMEOUT": "1", **extra}


def trees_dir(root: Path) -> Path:
    d = root / "trees"
    for idx in (1, 2, 3, 4, 6, 7):
        tf.write_tree(tf.tree_many_leaves(), d, idx)
    return d


def run(kind: str, backend: str, out: Path, env: dict, textcraft_server: str, tables: dict[str, Path]):
    """One script run of ``kind`` writing under ``out``; returns (process, the
    folder of its main outputs)."""
    if kind == "mcts":
        res = run_script("mcts_collection.py", "--env_server_base", textcraft_server, "--backend", backend,
                         "--model_name", "m", "--min", "0", "--max", "10", "--concurrency", "4",
                         "--output_dir", out, env={"TASK": "textcraft", "MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "2",
                                                   **env})
        return res, out / "textcraft" / "m"
    if kind == "eval":
        res = run_script("eval.py", "--env_server_base", textcraft_server, "--backend", backend, "--limit", "8",
                         "--max_steps", "6", "--concurrency", "4", "--output_dir", out,
                         env={"TASK": "textcraft", "MODEL_NAME": "scripted", **env})
        return res, out / "textcraft" / "scripted_eval"
    res = run_script("path_collection.py", "--input_dir", trees_dir(out), "--output_dir", out / "data",
                     "--revise", "1", "--tree_batch", "1", "--backend", backend, env={"TASK": "textcraft", **env})
    return res, out / "data"


def outputs(kind: str, folder: Path) -> dict[str, bytes]:
    return files(folder, "*.jsonl") if kind == "path" else files(folder)


def assert_key_absent(res, *roots: Path) -> None:
    assert KEY not in res.stdout and KEY not in res.stderr
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert KEY.encode() not in path.read_bytes(), f"API key leaked into {path}"


@pytest.mark.parametrize("kind", ["mcts", "eval", "path"])
def test_runs_complete_through_20_percent_faults(kind, tmp_path, textcraft_server, tables):
    """Through 20% faults every script completes with the same outputs as a
    fault-free run; each retry is logged, printed and in the manifest."""
    table = tables["verifier" if kind == "path" else "search"]
    direct, direct_dir = run(kind, TABLE, tmp_path / "direct", {"MODEL_DIR": table}, textcraft_server, tables)
    assert direct.returncode == 0, direct.stderr[-2000:]

    proc, url = model_server(table, "--fail-rate", "0.2", "--fail-seed", "3", "--fail-kinds", "429,500,timeout")
    try:
        res, out_dir = run(kind, "openai", tmp_path / "api", openai_env(url, OPENAI_MAX_RETRIES="8"),
                           textcraft_server, tables)
    finally:
        stop_server(proc)
    assert res.returncode == 0, res.stderr[-3000:]
    assert outputs(kind, out_dir) == outputs(kind, direct_dir) and outputs(kind, out_dir)
    retries = int(re.search(r"retries (\d+)", res.stdout).group(1))
    assert retries > 0 and res.stderr.count("; retry ") == retries
    assert re.search(r"HTTP 429|HTTP 500|APITimeoutError", res.stderr)
    manifest = {"mcts": out_dir / "manifest.json", "eval": out_dir / "manifest.json",
                "path": out_dir / "textcraft_centric.manifest.json"}[kind]
    stats = json.loads(manifest.read_text())["stats"]
    assert stats.get("backend", stats)["retries"] == retries
    assert_key_absent(res, tmp_path)


@pytest.mark.parametrize("kind", ["mcts", "eval", "path"])
def test_dead_endpoint_stops_with_one_line_after_the_bound(kind, tmp_path, textcraft_server, tables):
    """An endpoint that always fails stops every script after the retry
    bound with exit 2 and one error line, no traceback."""
    proc, url = model_server(tables["search"], "--fail-rate", "1.0", "--fail-kinds", "429,500,timeout")
    try:
        res, _ = run(kind, "openai", tmp_path, openai_env(url, OPENAI_MAX_RETRIES="2"), textcraft_server, tables)
    finally:
        stop_server(proc)
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: OpenAI endpoint {url}/v1") and "failed after 3 attempts (2 retries)" in last
    assert "Traceback" not in res.stderr
    assert_key_absent(res, tmp_path)


def test_rejected_key_stops_at_once_without_showing_it(tmp_path, textcraft_server, tables):
    """A rejected key stops the run at once (no retry) with exit 2 and a
    hint to check OPENAI_API_KEY, never showing the key."""
    proc, url = start_server("tests.support.openai_server", "--policy-json", str(tables["search"]),
                             "--api-key", "the-server-wants-another-key")
    try:
        res, _ = run("eval", "openai", tmp_path, openai_env(url), textcraft_server, tables)
    finally:
        stop_server(proc)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "rejected the request" in last and "HTTP 401" in last and "Check OPENAI_API_KEY" in last
    assert "; retry " not in res.stderr   # a 401 is not retried
    assert_key_absent(res, tmp_path)
