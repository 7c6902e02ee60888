"""Check that an environment holds every direct dependency at its declared floor.

    python scripts/check_floors.py requirements.txt [more files...]

``make check-floors`` installs requirements.txt with the lowest versions its
lines allow for the direct dependencies (uv's ``--resolution lowest-direct``)
and then runs this in that environment, before the trainer and backend tests.
A floor the resolver had to lift (no wheel for this Python, yanked, or
excluded by another package's own bounds) is a floor the code never runs on:
it is reported with the version actually installed, and the command exits 1,
so the file is corrected rather than left claiming a range nobody tested.

Reads each line's lowest allowed version: ``==X`` or ``>=X`` (with or without
an upper bound); lines without one (a bare name, ``~=``, URLs) are skipped, and
so are ``-r`` includes: name every file to check.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version


@dataclass(frozen=True)
class Floor:
    """One requirement line's lowest allowed version."""

    name: str
    version: Version
    line: str


def floor_of(line: str) -> Optional[Floor]:
    """The line's floor (``==X`` or ``>=X``), None for a comment, an option
    or a requirement without one."""
    text = line.split("#", 1)[0].strip()
    if not text or text.startswith("-"):
        return None
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"not a requirement line: {text!r} ({exc})") from None
    lows = [Version(s.version) for s in req.specifier if s.operator in ("==", ">=")]
    return Floor(req.name, min(lows), text) if lows else None


def floors(path: Path) -> list[Floor]:
    return [f for f in map(floor_of, path.read_text(encoding="utf-8").splitlines()) if f]


def installed(name: str) -> Optional[Version]:
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


def lifted(found: list[Floor]) -> list[str]:
    """One line per floor this environment does not hold exactly (a local
    label such as torch's ``+cpu`` is not a difference)."""
    problems = []
    for f in found:
        got = installed(f.name)
        if got is None:
            problems.append(f"{f.name}: not installed ({f.line})")
        elif Version(got.public) != f.version:
            problems.append(f"{f.name}: the floor is {f.version} but {got} was installed ({f.line}): raise the floor "
                            f"to {got.public} or find why {f.version} cannot install")
    return problems


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="requirement files whose floors must be installed")
    args = parser.parse_args(argv)
    found = [f for path in args.files for f in floors(path)]
    problems = lifted(found)
    for line in problems:
        print(f"check_floors: {line}", file=sys.stderr)
    if not problems:
        print(f"check_floors: all {len(found)} floors installed as declared: "
              + ", ".join(f"{f.name}=={f.version}" for f in found))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
