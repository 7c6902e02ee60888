"""Which model made a folder of results, so that a resumed run never adds to
another model's folder.

Eval and search folders are named after the model (``agent_r.paths``:
``{model folder}_{MODEL_TYPE}``, ``{TASK}/{model folder}``), and a fine-tuned
model lies in a folder called ``hf`` wherever it was made: two models of one
name would share a folder, and a resumed run would count the first model's
finished episodes or trees as the second's. Every manifest records the
model (name, folder, weights' sha256), and a run refuses a folder whose
recorded model is another, before it writes anything.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from agent_r.io import read_json
from agent_r.settings import UsageError

MODEL_KEY = "model"


def model_identity(backend: Any) -> dict[str, Optional[str]]:
    """The model a run's ``BackendSettings`` name: its name, its folder
    (relative to the repository where inside it) and its weights' sha256;
    the last two None for a hub id or a served model."""
    from agent_r.llm.model_files import weights_sha256
    from agent_r.paths import model_name, portable

    folder = backend.model_dir if backend.model_dir and Path(backend.model_dir).is_dir() else None
    if folder is None and not backend.model_dir and backend.backend not in ("openai",):
        from agent_r.llm.model_files import resolve_model_dir   # MODEL_DIR unset: the bundled model
        try:
            folder = resolve_model_dir(None)
        except UsageError:
            folder = None
    return {"name": model_name(backend), "path": portable(folder) if folder else None,
            "sha256": weights_sha256(folder) if folder else None}


def recorded_identity(folder: Path) -> Optional[dict[str, Any]]:
    """The model an earlier run of ``folder`` recorded: a manifest's ``model``
    entry, else (folders written before manifests held one) the sha256 and
    model folder of its summary; None where nothing names one."""
    for path in sorted(folder.glob("manifest*.json")) + [folder / "summary.json"]:
        try:
            data = read_json(path) if path.is_file() else None
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if isinstance(data.get(MODEL_KEY), dict):
            return data[MODEL_KEY]
        if data.get("model_sha256"):
            config = data.get("config") if isinstance(data.get("config"), dict) else {}
            return {"name": config.get("model_name"), "path": config.get("model_dir"), "sha256": data["model_sha256"]}
    return None


def shown_model(identity: dict[str, Any]) -> str:
    where = identity.get("path") or identity.get("name") or "an unnamed model"
    sha = identity.get("sha256")
    return f"{where} (weights {sha[:12]})" if sha else str(where)


def same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two identities name one model: by weights where both know
    them, else by folder; a pair that shares neither counts as the same
    (nothing tells them apart)."""
    if a.get("sha256") and b.get("sha256"):
        return a["sha256"] == b["sha256"]
    if a.get("path") and b.get("path"):
        return a["path"] == b["path"]
    return True


def check_same_model(folder: Path, identity: dict[str, Any], what: str) -> None:
    """UsageError when ``folder`` holds ``what`` of another model than
    ``identity``'s; nothing when it holds none or this model's."""
    recorded = recorded_identity(folder) if folder.is_dir() else None
    if recorded is not None and not same_model(recorded, identity):
        raise UsageError(f"{folder} holds the {what} of {shown_model(recorded)}, not of this model, {shown_model(identity)}: "
                         "set MODEL_NAME (--model_name) to give this model a folder of its own, or pass another "
                         "--output_dir")
