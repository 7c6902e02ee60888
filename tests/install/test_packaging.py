"""The installable project (pyproject.toml): every package and every file the
code opens at run time is declared, the wheel built from it holds exactly
those and works from outside the checkout, and its dependencies are
requirements.txt's runtime lines. No network: the wheel is built with the
setuptools of the running environment (no build isolation)."""
from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from setuptools import find_packages

from agent_r import view
from agent_r.envs import ENVS, SPLIT_DIR
from agentenv_client.base import INSTRUCTION_DIR

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("agent_r", "agentenv_client", "agentenv_servers")
TEST_ONLY = {"pytest", "pytest-xdist", "selenium", "hypothesis", "pytest-randomly"}   # requirements.txt lines for the test suite


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def project_files() -> list[str]:
    """The files of the three packages, as git sees them (tracked or new, not
    ignored): no caches, no build output."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *ROOTS], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return sorted(name for name in listed if (ROOT / name).is_file())


def package_of(path: str) -> tuple[str, str]:
    """(the innermost package holding ``path``, the path relative to it)."""
    parts = PurePosixPath(path).parts
    for cut in range(len(parts) - 1, 0, -1):
        if (ROOT.joinpath(*parts[:cut]) / "__init__.py").is_file():
            return ".".join(parts[:cut]), "/".join(parts[cut:])
    raise AssertionError(f"{path} is in no package")


def declared(path: str) -> bool:
    package, rel = package_of(path)
    patterns = pyproject()["tool"]["setuptools"]["package-data"].get(package, [])
    return any(fnmatch.fnmatch(rel, pattern) for pattern in patterns)


def requirements(path: str) -> dict[str, str]:
    """name -> specifier of a requirements file's lines (includes and comments skipped)."""
    lines = (line.split("#")[0].strip() for line in (ROOT / path).read_text().splitlines())
    reqs = [Requirement(line) for line in lines if line and not line.startswith("-")]
    return {canonicalize_name(r.name): str(r.specifier) for r in reqs}


def as_dict(reqs: list[str]) -> dict[str, str]:
    return {canonicalize_name(Requirement(r).name): str(Requirement(r).specifier) for r in reqs}


def test_every_package_is_found():
    """The package search finds exactly the folders with an __init__.py under
    agent_r, agentenv_client and agentenv_servers (subpackages included)."""
    include = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(find_packages(str(ROOT), include=include))
    on_disk = {str(PurePosixPath(f).parent).replace("/", ".") for f in project_files() if f.endswith("/__init__.py")}
    assert found == on_disk and {"agent_r", "agent_r.envs", "agent_r.llm", "agent_r.splits"} <= found


def test_every_file_the_code_loads_is_declared_package_data():
    """Every non-Python file in the packages is declared, every declared
    pattern matches a file, and the files the code opens - the viewer's
    template, each environment's split lists, each client's instruction - are
    among them."""
    data = [f for f in project_files() if not f.endswith(".py")]
    assert [f for f in data if not declared(f)] == []
    for package, patterns in pyproject()["tool"]["setuptools"]["package-data"].items():
        held = [rel for pkg, rel in map(package_of, data) if pkg == package]
        for pattern in patterns:
            assert any(fnmatch.fnmatch(rel, pattern) for rel in held), f"{package}: {pattern} matches no file"
    loaded = [view.TEMPLATE] + [SPLIT_DIR / name for spec in ENVS.values() for split in spec.splits
                                for name in (split.test, split.train) if name]
    loaded += [INSTRUCTION_DIR / f"{name}.txt" for name in ENVS]
    for path in loaded:
        rel = path.resolve().relative_to(ROOT).as_posix()
        assert rel in data and declared(rel), rel


TRL_STACK = ("trl", "tensorboard")   # the dpo extra


def test_dependencies_are_the_requirements_runtime_lines():
    """dependencies + the dpo and test extras are requirements.txt line for
    line; the vllm extra is requirements-gpu.txt's vllm pin; Python 3.11 or newer."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    assert as_dict(project["dependencies"]) == {k: v for k, v in requirements("requirements.txt").items()
                                                 if k not in TEST_ONLY and k not in TRL_STACK}
    assert as_dict(extras["dpo"] + extras["test"]) == {k: v for k, v in requirements("requirements.txt").items()
                                                       if k in TEST_ONLY or k in TRL_STACK}
    assert as_dict(extras["vllm"]) == {"vllm": requirements("requirements-gpu.txt")["vllm"]}
    assert project["requires-python"] == ">=3.11"


def test_the_wheel_holds_the_packages_and_works_outside_the_checkout(tmp_path):
    """The wheel built from a copy of the project holds every Python file and
    declared data file of the packages and nothing else (no tests, scripts or
    models); installed into a folder of its own, it loads every split list,
    instruction and the viewer template from there."""
    src = tmp_path / "src"
    files = project_files()
    for name in [*files, "pyproject.toml", "README.md"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "out"),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "out").glob("agent_r-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    payload = sorted(n for n in names if ".dist-info/" not in n)
    assert payload == sorted(f for f in files if f.endswith(".py") or declared(f))
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Python: >=3.11" in metadata and "Requires-Dist: scienceworld==1.2.3" in metadata

    site = tmp_path / "site"
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    probe = ("import json, agent_r, agent_r.view as view\n"
             "from agent_r.envs import ENVS\n"
             "from agentenv_client import load_instruction\n"
             "print(json.dumps({'file': agent_r.__file__, 'template': view.TEMPLATE.is_file(),\n"
             "  'tests': {name: len(spec.split_indices('test')) for name, spec in ENVS.items()},\n"
             "  'instructions': {name: bool(load_instruction(name)) for name in ENVS}}))\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr[-2000:]
    seen = json.loads(ran.stdout)
    assert Path(seen["file"]).is_relative_to(site) and seen["template"] is True
    assert seen["tests"] == {"textcraft": 100, "sciworld": 200, "webshop": 200}
    assert seen["instructions"] == {"textcraft": True, "sciworld": True, "webshop": True}
