"""Model names as an OpenAI-compatible server serves them, for the tests that
a run's folder stays inside its output root: ``vllm serve /models/llama``
serves the name ``/models/llama`` (a path), a hub model is served as
``org/name``. ``served_name`` makes the path-like name point into the test's
own tmp_path, so a run that wrongly joined it would write there, where the
test looks; ``FOLDER`` is the folder each kind of name must give."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.env_fixtures import ROOT
from tests.support.faults import script_env

KINDS = ("path", "hub")
FOLDER = {"path": "llama", "hub": "meta-llama--Llama-3.1-8B-Instruct"}


def served_name(kind: str, tmp_path: Path) -> str:
    return str(tmp_path / "models" / "llama") if kind == "path" else "meta-llama/Llama-3.1-8B-Instruct"


def run_in(cwd: Path, script: str, *args, env: dict) -> subprocess.CompletedProcess:
    """``python <script> args`` as a user runs it from ``cwd`` (relative default paths land there)."""
    res = subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], cwd=cwd, env=script_env(env),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{script} exited {res.returncode}:\n{res.stdout}\n{res.stderr[-3000:]}"
    return res


def openai_env(server: str, name: str, **extra) -> dict:
    """The env of a run whose model is served at ``server`` under ``name``."""
    return {"TASK": "textcraft", "BACKEND": "openai", "OPENAI_BASE_URL": server, "MODEL_NAME": name, **extra}


def files_under(folder: Path) -> set[str]:
    """Every file under ``folder``, relative to it."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
