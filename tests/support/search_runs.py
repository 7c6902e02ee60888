"""The search as the search tests run it: in process through the batch driver
(``run``: one Outcome per tree) and as a user runs mcts_collection.py
(``collect``: a subprocess against a local env server), and the tree files
a run leaves (``tree_files``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent_r import envs
from agent_r.search import SearchSettings, search_trees
from tests.support.env_fixtures import ROOT


TEXTCRAFT = envs.get_env("textcraft")
C = 0.25


def run(indices, server, backend, concurrency=1, made=None, **cfg):
    results = []
    made = [] if made is None else made

    def make_client():
        made.append(TEXTCRAFT.make_client(server))
        return made[-1]

    driver = search_trees(indices, TEXTCRAFT, make_client, backend,
                          SearchSettings(concurrency=concurrency, **cfg), on_tree=results.append)
    return {r.job.idx: r for r in results}, driver, made


DOUBLE = "python:tests.support.search_doubles:seeded_textcraft_backend"


def collect(out: Path, server: str, *flags: str, env: dict | None = None, wait: bool = True):
    # the repository first, then a tool's own (mutmut)
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                "TASK": "textcraft", "LOGLEVEL": "WARNING", **(env or {})}
    cmd = [sys.executable, str(ROOT / "mcts_collection.py"), "--env_server_base", server, "--output_dir", str(out), *flags]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300)


def tree_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("search_results_*.json"))}


SEARCH_ENV = {"MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3"}
