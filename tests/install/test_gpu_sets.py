"""The GPU install sets resolve (README "Installing", requirements-gpu.txt,
requirements-train-gpu.txt): pip's own resolver in dry-run mode against the
package registry, for Linux x86_64 / CPython 3.11 CUDA wheels, so that a pin
change cannot silently break the cluster install. Nothing is installed.

Needs the package registry (CI has it): marked ``network``. The machine's pip
configuration is ignored (``PIP_CONFIG_FILE=/dev/null``, no find-links or
constraints), because a dev box's local CPU torch wheel would otherwise stand
in for the CUDA build a GPU node gets. The collection set is resolved with
explicit target-platform flags (binary wheels only: vllm's set has no sdist);
the training set natively (deepspeed is an sdist, which pip will not combine
with platform flags), so that part needs a Linux x86_64 CPython 3.11 runner.
Both resolve at once (~1.5 min); wheels are inspected by HTTP range requests
(``fast-deps``) where pip still has it, instead of downloading ~1 GB.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.network

# glibc 2.35 (Ubuntu 22.04) and everything older pip may pick; vllm 0.32's
# llguidance needs manylinux_2_31 or newer on x86_64.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--only-binary=:all:"]
TARGET_MARKERS = {"python_version": "3.11", "python_full_version": "3.11.0", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                  "platform_machine": "x86_64", "os_name": "posix"}
NATIVE_OK = sys.platform == "linux" and platform.machine() == "x86_64" and sys.version_info[:2] == (3, 11)
LOCAL_PIP_SETTINGS = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_REQUIREMENT",
                      "PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_NO_DEPS", "PIP_ONLY_BINARY", "PIP_NO_BINARY")


def pip_env() -> dict[str, str]:
    """The caller's environment without pip settings that point at local
    wheels or constrain the resolution; PIP_INDEX_URL (a mirror) and
    certificate/proxy settings stay."""
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_PIP_SETTINGS}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def start_resolve(requirements: str, report: Path, extra: list[str], fast: bool = True) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), *(["--use-feature=fast-deps"] if fast else []), *extra,
           "-r", str(ROOT / requirements)]
    return subprocess.Popen(cmd, cwd=ROOT, env=pip_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_resolve(proc: subprocess.Popen, requirements: str, report: Path, extra: list[str]) -> dict:
    # a hang guard, not a speed check: on a 2-core box beside other work one resolve took over 400 s
    _, err = proc.communicate(timeout=1800)
    if proc.returncode != 0 and "fast-deps" in err and ("invalid choice" in err or "no such" in err.lower()):
        return wait_resolve(start_resolve(requirements, report, extra, fast=False), requirements, report, extra)
    lines = "\n".join(line for line in err.splitlines() if "fast-deps" not in line)
    assert proc.returncode == 0, f"pip cannot resolve {requirements} (a conflict, or no registry access):\n" \
                                 f"{lines[-4000:]}"
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """Both sets, resolved side by side."""
    tmp = tmp_path_factory.mktemp("resolve")
    jobs = {"requirements-gpu.txt": [arg for p in PLATFORMS for arg in ("--platform", p)] + TARGET}
    if NATIVE_OK:
        jobs["requirements-train-gpu.txt"] = []
    procs = {name: start_resolve(name, tmp / f"{name}.json", extra) for name, extra in jobs.items()}
    return {name: wait_resolve(proc, name, tmp / f"{name}.json", jobs[name]) for name, proc in procs.items()}


def resolved(report: dict) -> dict[str, dict]:
    return {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}


def version(report: dict, name: str) -> Version:
    return Version(resolved(report)[canonicalize_name(name)]["metadata"]["version"])


def unmet(report: dict, markers: dict[str, str]) -> list[str]:
    """``pip check`` over the resolved set: every requirement of every package
    (markers evaluated for the target, with the extras asked of it) is met by
    the version chosen."""
    chosen = resolved(report)
    wanted_extras: dict[str, set[str]] = {}
    for item in report["install"]:
        name = canonicalize_name(item["metadata"]["name"])
        wanted_extras.setdefault(name, set()).update(item.get("requested_extras") or [])
        for req in map(Requirement, item["metadata"].get("requires_dist") or []):
            if req.extras and not req.marker:
                wanted_extras.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    problems = []
    for name, item in chosen.items():
        for req in map(Requirement, item["metadata"].get("requires_dist") or []):
            extras = wanted_extras.get(name, set()) | {""}
            if req.marker and not any(req.marker.evaluate({**markers, "extra": e}) for e in extras):
                continue
            dep = chosen.get(canonicalize_name(req.name))
            if dep is None:
                problems.append(f"{name} needs {req}, which is not in the set")
            elif not req.specifier.contains(Version(dep["metadata"]["version"]), prereleases=True):
                problems.append(f"{name} needs {req}, the set has {dep['metadata']['version']}")
    return problems


def project_requirements(path: str) -> list[Requirement]:
    lines = (line.split("#")[0].strip() for line in (ROOT / path).read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def test_collection_gpu_set_resolves_with_vllm_and_its_torch(reports):
    """requirements-gpu.txt resolves to vllm 0.32.0 with PyPI's CUDA torch 2.13.0,
    keeps the project's own pins, and every requirement in the set is met."""
    report = reports["requirements-gpu.txt"]
    assert version(report, "vllm") == Version("0.32.0")
    assert version(report, "torch") == Version("2.13.0")     # PyPI's CUDA build: no +cpu local version
    torch_deps = resolved(report)["torch"]["metadata"]["requires_dist"]
    assert any(dep.startswith("cuda-toolkit") for dep in torch_deps), "expected the CUDA torch wheel"
    for req in project_requirements("requirements.txt"):      # the project's own deps, as pinned
        assert req.specifier.contains(version(report, req.name), prereleases=True), req
    assert unmet(report, {**default_environment(), **TARGET_MARKERS}) == []


@pytest.mark.skipif(not NATIVE_OK, reason="the training set resolves natively (deepspeed is an sdist): needs a "
                                          "Linux x86_64 CPython 3.11 runner")
def test_training_gpu_set_keeps_a_matching_torchvision(reports):
    """requirements-train-gpu.txt resolves to xtuner 0.2.0 with the same CUDA torch
    as the collection set and a torchvision made for it; every requirement is met."""
    report = reports["requirements-train-gpu.txt"]
    assert version(report, "xtuner") == Version("0.2.0") and version(report, "torch") == Version("2.13.0")
    vision = resolved(report)["torchvision"]["metadata"]["requires_dist"]
    assert any(Requirement(dep).name == "torch" and Version("2.13.0") in Requirement(dep).specifier for dep in vision)
    for req in project_requirements("requirements-train.txt"):
        assert req.specifier.contains(version(report, req.name), prereleases=True), req
    assert unmet(report, report["environment"]) == []
    # one CUDA torch for both environments: one driver, one wheel cache
    assert version(report, "torch") == version(reports["requirements-gpu.txt"], "torch")
