"""Provenance: what made an eval's numbers (the weights, backend and dtype,
every machine and project commit that played its episodes, the settings
that change outcomes), recorded in each summary.json, read back from
summaries written before it was recorded, and compared between runs.

Why a module of its own: the eval run writes it (agent_r.evaluation), the
compare table and the loop's rows read it (agent_r.report, agent_r.loop),
and the pair tables of the reproductions warn from it; a field nothing
records is ``unknown``, never guessed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent_r import paths
from agent_r.io import read_json
from agent_r.manifest import git_commit, machine

UNKNOWN = "unknown"
PROVENANCE_FIELDS = ("model_sha256", "backend", "dtype", "machines", "commits", "settings")


def of_summary(settings: Any, summary: dict[str, Any], earlier: dict[str, Any], played: bool) -> dict:
    """What made a summary's numbers, in one place: the weights, backend and
    dtype, every machine and project commit that played its episodes (an
    eval resumed elsewhere names both), and the settings that change
    outcomes. A field nothing records is ``unknown``, never guessed."""
    backend = summary.get("backend") or {}
    machines, commits = list(earlier.get("machines") or []), list(earlier.get("commits") or [])
    if played:
        machines += [m for m in [machine()] if m not in machines]
        commits += [c for c in [git_commit() or UNKNOWN] if c not in commits]
    return {"model_sha256": summary.get("model_sha256") or UNKNOWN,
            "backend": backend.get("backend") or UNKNOWN, "dtype": backend.get("dtype") or UNKNOWN,
            "machines": machines or [UNKNOWN], "commits": commits or [UNKNOWN],
            "settings": {"temperature": settings.temperature, "samples": settings.eval_samples,
                         "max_steps": settings.max_steps, "wait_reply": settings.wait_reply,
                         "max_new_tokens": settings.max_new_tokens, "max_token_length": settings.max_token_length}}


def earlier(run_dir: Path) -> dict[str, Any]:
    """The machines and commits that played the folder's episodes before this
    summary: the earlier summary's, then its manifests' (every invocation,
    also one killed before it wrote a summary)."""
    found: dict[str, list[str]] = {"machines": [], "commits": []}
    for path in [paths.summary_file(run_dir)] + sorted(run_dir.glob("manifest*.json")):
        try:
            old = read_json(path) if path.is_file() else {}
        except ValueError:
            continue
        if not isinstance(old, dict):
            continue
        got = old.get("provenance") if path.name == paths.SUMMARY else old
        for key, values in found.items():
            listed = got.get(key) if isinstance(got, dict) else None
            values += [v for v in listed or [] if isinstance(v, str) and v != UNKNOWN and v not in values]
    return found


def recorded_backend(run_dir: Path, own_manifest: str) -> dict[str, Any]:
    """The backend an earlier invocation of this run folder used: from its
    summary, else from the manifest it wrote (a run killed before its
    summary)."""
    out: dict[str, Any] = {}
    # a final unsharded pass over shards' episodes takes the backend a shard's manifest records
    manifests = [*sorted(run_dir.glob("manifest.shard-*.json")), paths.manifest_file(run_dir, own_manifest)]
    for path, keys in [*((m, ("backend",)) for m in manifests), (paths.summary_file(run_dir), ("backend", "backend_stats"))]:
        try:
            old = read_json(path) if path.exists() else {}
        except ValueError:
            continue
        out.update({k: old[k] for k in keys if isinstance(old, dict) and old.get(k) is not None})
    return out


def summary_file_of(run_dir: str | os.PathLike) -> Path:
    """A run's summary.json, or ``run_dir`` itself where it names a summary
    file (one kept apart from its run, as the sampled summaries of a
    reproduction are)."""
    return Path(run_dir) if str(run_dir).endswith(".json") else paths.summary_file(run_dir)


def recorded(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A finished run's provenance as its summary.json records it; a summary
    written before summaries held one gives what it does hold (weights,
    backend, dtype, settings) and ``unknown`` for the rest."""
    try:
        summary = read_json(summary_file_of(run_dir))
    except (OSError, ValueError):
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    if isinstance(summary.get("provenance"), dict):
        return summary["provenance"]
    backend, config = summary.get("backend") or {}, summary.get("config") or {}
    return {"model_sha256": summary.get("model_sha256") or "unknown", "backend": backend.get("backend") or "unknown",
            "dtype": backend.get("dtype") or "unknown", "machines": ["unknown"], "commits": ["unknown"],
            "settings": {k: config.get(c) for k, c in (("temperature", "temperature"), ("samples", "eval_samples"),
                                                      ("max_steps", "max_steps"), ("wait_reply", "wait_reply"),
                                                      ("max_new_tokens", "max_new_tokens"),
                                                      ("max_token_length", "max_token_length"))},
            "model_name": config.get("model_name")}


def warnings(run_dirs: list[str], labels: list[str], same_model_weights: bool = True) -> list[str]:
    """One line for each run that differs from the first in what can change
    its numbers without the model changing: the machine, dtype, backend or
    an eval setting, and the weights where both runs name the same model
    (unless ``same_model_weights`` is False: two recipes' models of one name,
    different by design). A field either run does not know is named as unknown.
    ``labels`` name the runs in the lines (report.path_labels)."""
    if len(run_dirs) < 2:
        return []
    records = [recorded(d) for d in run_dirs]
    names = labels
    first, lines = records[0], []
    for run_dir, name, record in zip(run_dirs[1:], names[1:], records[1:]):
        differs = []
        for field in ("machines", "dtype", "backend"):
            a, b = first.get(field), record.get(field)
            if "unknown" in (a, b) or a == ["unknown"] or b == ["unknown"]:
                differs.append(f"{field} unknown")
            elif a != b:
                differs.append(f"{field} {a} vs {b}")
        settings = [k for k in sorted(set(first.get("settings") or {}) | set(record.get("settings") or {}))
                    if (first.get("settings") or {}).get(k) != (record.get("settings") or {}).get(k)]
        if settings:
            differs.append("settings " + ", ".join(f"{k} {(first.get('settings') or {}).get(k)} vs "
                                                   f"{(record.get('settings') or {}).get(k)}" for k in settings))
        same_name = model_name(run_dirs[0]) == model_name(run_dir)
        if same_model_weights and same_name and "unknown" not in (first.get("model_sha256"), record.get("model_sha256")) \
                and first.get("model_sha256") != record.get("model_sha256"):
            differs.append(f"model_sha256 {first.get('model_sha256', '')[:12]} vs {record.get('model_sha256', '')[:12]} "
                           "for the same model name")
        if differs:
            lines.append(f"warning: {name} against {names[0]}: " + "; ".join(differs))
    return lines


def model_name(run_dir: str | os.PathLike) -> str | None:
    try:
        summary = read_json(summary_file_of(run_dir))
    except (OSError, ValueError):
        return None
    return ((summary.get("config") or {}).get("model_name")) if isinstance(summary, dict) else None
