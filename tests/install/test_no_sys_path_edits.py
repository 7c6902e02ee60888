"""The project is installed and its scripts run as modules: no file of the
repository edits ``sys.path`` to find it (a benchmark did, and ran only from
its own folder's parent)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDIT = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*(\+=|=[^=])")


def test_no_tracked_python_file_edits_sys_path():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    offenders = [name for name in tracked.stdout.split()     # this file shows one, in its own test below
                 if EDIT.search((ROOT / name).read_text()) and ROOT / name != Path(__file__).resolve()]
    assert offenders == []


def test_the_pattern_finds_an_edit():
    assert EDIT.search("if x:\n    sys.path.insert(0, str(ROOT))")
    assert not EDIT.search('assert "sys.path" not in text')
