"""Safety rules: over the repository's own Python and shell files, no command
is ever run through a shell on a string (user values could inject commands);
the local env servers listen on the loopback address unless told otherwise.
API keys: tests/backends/test_endpoint_faults.py."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.env_fixtures import free_port, stop_server
from tests.support.faults import listen_addresses, wait_for

ROOT = Path(__file__).resolve().parents[2]

# Built by concatenation so this file does not match itself.
PYTHON_SHELL = re.compile("|".join([
    r"shell\s*=\s*True",
    r"\bos\." + r"system\s*\(",
    r"\bos\." + r"popen\s*\(",
    r"\bsubprocess\.(?:run|Popen|call|check_call|check_output|getoutput|getstatusoutput)\(\s*f?[\"']",
    r"\bsubprocess\." + r"get(?:status)?output\(",
]))
SHELL_EVAL = re.compile(r"(^|[;&|]\s*)" + "ev" + r"al\s")


def repo_files(*suffixes: str) -> list[Path]:
    """The project's own files: tracked or new, not git-ignored (no venvs)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    paths = [ROOT / name for name in listed]
    return [p for p in paths if p.is_file() and (p.suffix in suffixes or p.name in ("Makefile", "run"))]


def test_no_shell_on_strings_in_python():
    """No Python file runs a command through a shell: no shell flag, no os-level
    system/popen call, no subprocess call on a string, no getoutput."""
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in repo_files(".py") for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if PYTHON_SHELL.search(line)]
    assert not found, "commands must be argument lists without a shell:\n" + "\n".join(found)
    assert len(repo_files(".py")) > 30   # the walk really saw the project


def test_no_eval_in_shell_scripts():
    """No shell script or Makefile evaluates a string."""
    scripts = [p for p in repo_files(".sh") if p.suffix == ".sh" or p.name in ("Makefile", "run")]
    assert any(p.name == "demo.sh" for p in scripts)
    found = [f"{p.relative_to(ROOT)}:{i}" for p in scripts
             for i, line in enumerate(p.read_text().splitlines(), 1) if SHELL_EVAL.search(line)]
    assert not found, "shell scripts must not eval strings: " + ", ".join(found)


def test_the_patterns_catch_what_they_should():
    """The patterns above match the unsafe forms and not the safe ones."""
    bad = ["subprocess.run(cmd, shell" + "=True)", "os." + "system('ls ' + name)", "subprocess.Popen(f\"ls {x}\")",
           "subprocess." + "getoutput(cmd)"]
    good = ["subprocess.run([sys.executable, script], check=True)", "subprocess.Popen(cmd, cwd=ROOT)"]
    assert all(PYTHON_SHELL.search(b) for b in bad)
    assert not any(PYTHON_SHELL.search(g) for g in good)
    assert SHELL_EVAL.search("ev" + "al $CMD") and not SHELL_EVAL.search("python eval.py --limit 3")


def test_servers_bind_loopback_unless_told_otherwise():
    """No --host: the server listens on 127.0.0.1 only (not 0.0.0.0 / ::)."""
    for module in ("agentenv_servers.textcraft", "agentenv_servers.sciworld"):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: listen_addresses(proc.pid, port), proc, timeout=90, what=f"{module} to listen")
            assert listen_addresses(proc.pid, port) == {"0100007F"}   # 127.0.0.1, little-endian hex
        finally:
            stop_server(proc)
