"""The project is installed and its scripts run as modules: no file of the
repository edits ``sys.path`` to find it (a benchmark did, and ran only from
its own folder's parent)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EDIT = re.compile(r"sys\.path\.(insert|append|extend|remove|pop|clear|__setitem__|__iadd__)\("
                  r"|sys\.path\s*(\[[^\]]*\])?\s*(\+=|=[^=])|del\s+sys\.path\b|setattr\(\s*sys\s*,\s*[\"']path[\"']")


def test_no_tracked_python_file_edits_sys_path():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    offenders = [name for name in tracked.stdout.split()     # this file shows one, in its own test below
                 if EDIT.search((ROOT / name).read_text()) and ROOT / name != Path(__file__).resolve()]
    assert offenders == []


@pytest.mark.parametrize("edit", ["if x:\n    sys.path.insert(0, str(ROOT))", "sys.path.append('..')",
                                  "sys.path.extend(['a'])", "sys.path = ['a'] + sys.path", "sys.path += ['a']",
                                  "sys.path[:0] = [str(ROOT)]", "sys.path[0:0]=['a']", "sys.path [0] = 'a'",
                                  "del sys.path[0]", "sys.path.remove('a')", "sys.path.pop(0)", "sys.path.clear()",
                                  "setattr(sys, 'path', [])", "sys.path.__setitem__(slice(0, 0), ['a'])"])
def test_the_pattern_finds_every_form_of_edit(edit):
    assert EDIT.search(edit)


@pytest.mark.parametrize("reading", ['assert "sys.path" not in text', "for p in sys.path:", "x = sys.path[0]",
                                     "if sys.path == old:", "print(sys.path)"])
def test_the_pattern_leaves_readings_alone(reading):
    assert not EDIT.search(reading)
