"""Ctrl-C (SIGINT) or SIGTERM (kill, a scheduler) in the middle of a run: exit
130 with the resume hint, the finished outputs kept, and every env the run
opened on the server closed."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.faults import GATED, SEARCH_INNER, TABLE_INNER, Gate, files, live_envs, run_script

ROOT = Path(__file__).resolve().parents[2]
SEARCH_ENV = {"TASK": "textcraft", "MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3"}


@pytest.mark.parametrize("script, signum", [("mcts_collection.py", signal.SIGINT), ("eval.py", signal.SIGINT),
                                            ("eval.py", signal.SIGTERM)])
def test_an_interrupt_closes_every_remote_env(tmp_path, own_server, script, signum):
    """SIGINT or SIGTERM mid-run: exit 130 with the resume hint, the finished outputs are
    kept, and the server holds no live env afterwards (each tree/episode
    closed its client). The signal lands while the run is held at a model
    call after its first output, with 6 envs open on the server."""
    url = own_server["url"]
    gate = Gate(tmp_path / "gate")
    if script == "mcts_collection.py":
        out_dir = tmp_path / "textcraft" / "m"
        args = ["--backend", GATED, "--model_name", "m", "--min", "0", "--max", "60", "--concurrency", "6"]
        env = {**SEARCH_ENV, **gate.env(SEARCH_INNER, files=(out_dir / "search_results_*.json", 1))}
    else:
        out_dir = tmp_path / "textcraft" / "t_eval"
        table = tmp_path / "policy.json"
        table.write_text(json.dumps({"default": ["Thought: t\nAction: inventory"]}))
        args = ["--backend", GATED, "--max_steps", "20", "--concurrency", "6", "--limit", "40"]
        env = {"TASK": "textcraft", "MODEL_DIR": table, "MODEL_NAME": "t",
               **gate.env(TABLE_INNER, files=(out_dir / "search_results_*.json", 1))}
    proc = run_script(script, "--env_server_base", url, "--output_dir", tmp_path, *args, env=env, wait=False)
    gate.wait(proc)
    assert live_envs(url) == 6
    kept = files(out_dir)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; finished outputs are kept" in err
    assert live_envs(url) == 0
    assert kept and files(out_dir) == kept     # the outputs finished before the signal, untouched


def test_a_sigterm_that_a_library_swallowed_is_raised_again_after_its_wait():
    """pyzmq's poll swallows the interrupt a SIGTERM raises while vLLM waits for
    its engine to start; raise_if_signalled (called after that wait) ends the
    run anyway, with the interrupt's exit code."""
    code = (
        "import os, signal, sys\n"
        "from agent_r.settings import raise_if_signalled, run_cli\n"
        "def main():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        signal.pthread_sigmask(signal.SIG_BLOCK, [])   # a point where the handler runs\n"
        "    except KeyboardInterrupt:\n"
        "        pass   # what the library does\n"
        "    print('went on', flush=True)\n"
        "    raise_if_signalled()\n"
        "    print('not reached', flush=True)\n"
        "run_cli(main)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stdout.split() == ["went", "on"]
    assert "interrupted; finished outputs are kept" in done.stderr
