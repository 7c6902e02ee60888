"""The version floors: scripts/check_floors.py reads each requirement line's
lowest allowed version and reports a floor the environment does not hold
exactly (one the resolver had to lift), and `make check-floors` names only
test files that exist. The check itself runs as `make check-floors` (its own
venv, PyPI): docs/training.md, "Version floors"."""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

from scripts import check_floors

ROOT = Path(__file__).resolve().parents[2]


def test_each_lines_floor_is_read():
    read = {line: check_floors.floor_of(line) for line in (
        "transformers>=5.0,<6", "torch==2.13.0", "numpy>=2.0   # why", "pytest", "-r requirements.txt",
        "# only a comment", "", "trl<2,>=1.16")}
    assert {k: (v.name, str(v.version)) for k, v in read.items() if v} == {
        "transformers>=5.0,<6": ("transformers", "5.0"), "torch==2.13.0": ("torch", "2.13.0"),
        "numpy>=2.0   # why": ("numpy", "2.0"), "trl<2,>=1.16": ("trl", "1.16")}
    with pytest.raises(ValueError, match="not a requirement line"):
        check_floors.floor_of("numpy >= = 2")


def test_a_lifted_floor_is_reported_and_an_exact_one_passes(tmp_path, capsys):
    have = Version(metadata.version("pytest"))
    exact = tmp_path / "exact.txt"
    exact.write_text(f"pytest>={have.public}\n")
    assert check_floors.main([str(exact)]) == 0
    assert f"all 1 floors installed as declared: pytest=={have.public}" in capsys.readouterr().out
    lifted = tmp_path / "lifted.txt"
    lifted.write_text("pytest>=1.0\nno-such-package-here>=1.0\n")
    assert check_floors.main([str(lifted)]) == 1
    said = capsys.readouterr().err.splitlines()
    assert said == [f"check_floors: pytest: the floor is 1.0 but {have} was installed (pytest>=1.0): raise the floor "
                    f"to {have.public} or find why 1.0 cannot install",
                    "check_floors: no-such-package-here: not installed (no-such-package-here>=1.0)"]


def test_the_make_target_checks_requirements_txt_and_names_existing_tests():
    make = (ROOT / "Makefile").read_text()
    block = make[make.index("FLOOR_TESTS ?="):make.index(".PHONY: check-floors")]
    tests = re.findall(r"tests/\S+", block)
    assert tests and [t for t in tests if not (ROOT / t).exists()] == []
    assert "--resolution lowest-direct -r requirements.txt" in make
    assert "scripts/check_floors.py requirements.txt" in make
