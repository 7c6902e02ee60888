"""reproduction/one_call.py: an iteration in calls of a short-lived machine.
A call whose budget ends after its first piece banks that piece and stops
(exit 3); a second call, on a fresh runs folder, finishes the iteration from
the bank; the result equals one uninterrupted call's. The stop is the
budget's rule (the first stage always starts, a later piece only if its
estimate fits), so the test holds it at a known point with a piece
estimate that only the first piece fits under, never racing the clock. Test double: the loop's weights-playing
policy, not a model."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from agent_r.io import locked
from agent_r.paths import EXPORT_FILE
from reproduction.one_call import CALLS, running_variants
from reproduction.pieces import ARCHIVE, bank as bank_run, status
from tests.loop.conftest import ROOT, comparable
from tests.loop.doubles import DOUBLE
from tests.support.faults import sigint_as_at_a_terminal

CALL_AGAIN = 3   # the documented exit code of a call its budget cut (Makefile, docs/iterate.md): not the module's constant


def one_call(tmp_path: Path, base_model: str, where: str, piece_s: str) -> subprocess.CompletedProcess:
    """One call on a fresh machine: an empty runs folder, the bank alone."""
    runs = tmp_path / where / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    env = {**os.environ, "RUNS": str(runs), "NAME": "t", "MODEL_DIR": base_model, "TRAIN_TASKS": "4",
           "ITERA": "3", "N_GEN": "3", "MAX_DEPTH": "4", "EVAL_LIMIT": "2", "REVISE_LIMIT": "1",
           "EVAL_MAX_STEPS": "3", "REVISE_MAX_STEPS": "2", "VARIANTS": "agent-r", "BANK": str(tmp_path / where / "bank"),
           "PY": str(ROOT / ".venv/bin/python"), "BACKEND": DOUBLE, "GENERAL_DATA": "", "EPOCHS": "1", "LR": "1e-3",
           "ACCUMULATIVE_COUNTS": "1", "MAX_LENGTH": "1024", "CONCURRENCY": "2", "MAX_NEW_TOKENS": "40",
           "SHARDS": "0", "REPRO_OUT": str(tmp_path / where / "results"), "ITERATIONS": "1", "PIECES": "2",
           "BUDGET_S": "100000", "PIECE_S": piece_s, "RESERVE_S": "0", "MACHINE": f"the {where} box"}
    env.pop("REPRODUCE_COPY", None)
    return subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "reproduction.one_call"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)


def first_session(tmp_path: Path, where: str) -> Path:
    """The run's task list as a first session banks it: tasks the double solves."""
    first = tmp_path / where / "first" / "t"
    first.mkdir(parents=True)
    (first / "train_tasks.json").write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in (1, 2, 3, 4)]))
    bank_run(first, tmp_path / where / "bank")
    return tmp_path / where / "bank"


def archived(bank: Path, member: str) -> bytes:
    with tarfile.open(bank / ARCHIVE, "r:gz") as tar:
        return tar.extractfile(member).read()


def test_a_call_cut_by_its_budget_banks_and_the_next_call_finishes_the_same_iteration(tmp_path, base_model):
    cut, whole = first_session(tmp_path, "cut"), first_session(tmp_path, "whole")
    stopped = one_call(tmp_path, base_model, "cut", piece_s="99999")   # no second piece fits
    assert stopped.returncode == CALL_AGAIN, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    assert "budget: piece 2/2 needs" in stopped.stdout
    assert status(cut, "t", 1, 2, "agent-r")[1] == [2]    # piece 1 banked, piece 2 to run
    with tarfile.open(cut / ARCHIVE, "r:gz") as tar:   # the run's own state: nothing of iteration 1 yet
        assert not [m for m in tar.getnames() if m.startswith("iter_1")]

    resumed = one_call(tmp_path, base_model, "cut", piece_s="0")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    straight = one_call(tmp_path, base_model, "whole", piece_s="0")
    assert straight.returncode == 0, straight.stdout[-2000:] + straight.stderr[-3000:]

    rows = {w: json.loads((tmp_path / w / "results" / "results.json").read_text())["rows"] for w in ("cut", "whole")}
    assert comparable(rows["cut"]) == comparable(rows["whole"])
    assert [(r["iteration"], r["variant"]) for r in rows["cut"]] == [(0, "base"), (1, "agent-r")]
    assert rows["cut"][1]["data"]["pieces"] == 2 and rows["cut"][1]["search"]["textcraft"]["trees"] == 4
    data = f"iter_1/data/agent-r/{EXPORT_FILE}"
    assert archived(cut, data) == archived(whole, data)   # the same training rows, exported from the same trees

    calls = [json.loads(line) for line in (cut / CALLS).read_text().splitlines()]
    assert [(c["stage"], c["ended"]) for c in calls] == [
        ("piece 1/2 of iteration 1", "done"), ("piece 2/2 of iteration 1", "done"),
        ("merge, fine-tunes and evals of iteration 1", "done")]
    assert calls[0]["call"] != calls[1]["call"] == calls[2]["call"]
    assert {c["machine"] for c in calls} == {"the cut box"} and all(c["seconds"] > 0 for c in calls)
    assert len((whole / CALLS).read_text().splitlines()) == 3


def test_a_stage_that_will_not_stop_is_killed_with_its_children_and_the_call_says_so(tmp_path):
    """The budget's end holds a stage at a known point: a stage that ignores SIGINT and SIGTERM
    (and whose child inherits that) runs past it, so only SIGKILL ends it; nothing outlives the call."""
    pid_file = tmp_path / "child.pid"
    stage = f"bash -c 'trap \"\" INT TERM; sleep 600 & echo $! > {pid_file}; wait'"
    env = {**os.environ, "BANK": str(tmp_path / "bank"), "REPRO_OUT": str(tmp_path), "RUNS": str(tmp_path / "runs"),
           "NAME": "t", "ITERATIONS": "1", "PIECES": "1", "VARIANTS": "agent-r", "BUDGET_S": "3", "RESERVE_S": "0",
           "GRACE_S": "1", "STAGE_COMMAND": stage, "MACHINE": "here"}
    try:   # a call that fails to kill its stage would wait for the sleep: bounded here, and the sleep killed
        done = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "reproduction.one_call"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the call did not end within 90 s of a 3 s budget: it did not kill its stage")
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert done.returncode == CALL_AGAIN and "more pieces (PIECES)" in done.stdout, done.stdout + done.stderr
    [line] = (tmp_path / "bank" / CALLS).read_text().splitlines()
    assert json.loads(line)["ended"] == "budget" and json.loads(line)["machine"] == "here"
    child = int(pid_file.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_a_failed_stage_is_recorded_and_the_call_says_where_to_look(tmp_path):
    env = {**os.environ, "BANK": str(tmp_path / "bank"), "REPRO_OUT": str(tmp_path), "RUNS": str(tmp_path / "runs"),
           "NAME": "t", "ITERATIONS": "1", "PIECES": "2", "VARIANTS": "good", "STAGE_COMMAND": "bash -c 'exit 5'",
           "MACHINE": "here"}
    done = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "reproduction.one_call"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "piece 1/2 failed (exit 5)" in done.stdout and "retries" in done.stdout
    [line] = (tmp_path / "bank" / CALLS).read_text().splitlines()   # piece 2 never started
    assert json.loads(line)["ended"] == "failed (exit 5)"


def test_variants_that_end_earlier_do_not_run_the_iteration():
    assert running_variants(["agent-r", "direct", "good", "eto"], 3, "good=1,eto=1") == ["agent-r", "direct"]
    assert running_variants(["good"], 1, "good=1") == ["good"]


@pytest.mark.parametrize("env, says", [({"BANK": ""}, "BANK is not set"), ({"ITERATIONS": "0"}, "ITERATIONS=0"),
                                       ({"VARIANTS": "good", "VARIANT_ITERATIONS": "good=1"}, "no variant")])
def test_bad_settings_get_one_line(tmp_path, env, says):
    base = {**os.environ, "BANK": str(tmp_path / "bank"), "ITERATIONS": "2", "VARIANTS": "agent-r"}
    done = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "reproduction.one_call"], env={**base, **env},
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_call_stops_its_stage_and_records_it(tmp_path, signum):
    """The stage runs in a session of its own, out of reach of the terminal's
    Ctrl-C: the call must stop it, or a search runs on that nobody banks. The
    stage writes its pid once it runs (the gate), then waits for a signal."""
    started = tmp_path / "stage.pid"
    stage = f"bash -c 'echo $$ > {started}.tmp; mv {started}.tmp {started}; sleep 600 & wait'"
    env = {**os.environ, "BANK": str(tmp_path / "bank"), "REPRO_OUT": str(tmp_path), "RUNS": str(tmp_path / "runs"),
           "NAME": "t", "ITERATIONS": "1", "PIECES": "1", "VARIANTS": "agent-r", "BUDGET_S": "100000",
           "GRACE_S": "5", "STAGE_COMMAND": stage, "MACHINE": "here", "PYTHONFAULTHANDLER": "1"}
    call = subprocess.Popen([str(ROOT / ".venv/bin/python"), "-m", "reproduction.one_call"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_at_a_terminal)   # a suite run as a background job ignores SIGINT
    try:
        while not started.exists():
            assert call.poll() is None, call.communicate()
            time.sleep(0.05)
        call.send_signal(signum)
        try:
            out, err = call.communicate(timeout=120)
        except subprocess.TimeoutExpired:   # say where the call hangs: faulthandler prints its stack on SIGABRT
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(started.read_text()), signal.SIGKILL)   # the stage holds the pipes open
            call.send_signal(signal.SIGABRT)
            out, err = call.communicate(timeout=60)
            pytest.fail(f"the call did not end within 120 s of the signal:\n{err}")
        stage_pid = int(started.read_text())
        left = Path(f"/proc/{stage_pid}").exists() and "Z" not in Path(f"/proc/{stage_pid}/stat").read_text().split()[2]
    finally:
        call.kill()
        if started.exists():   # a failing run must not leave the stage behind either
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(started.read_text()), signal.SIGKILL)
    assert call.returncode == 130 and not left, out + err
    [line] = (tmp_path / "bank" / CALLS).read_text().splitlines()
    assert json.loads(line)["ended"] == "interrupted"


def waits_on_a_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked on a flock (/proc/locks lists waiters after "->")."""
    return any(line.split()[1] == "->" and line.split()[5] == str(pid)
               for line in Path("/proc/locks").read_text().splitlines() if len(line.split()) > 5)


def test_calls_of_two_variants_sharing_a_bank_keep_each_others_record_lines(tmp_path):
    """Agent-r's and direct's calls may run side by side on one bank; each
    rewrites calls.jsonl whole. The test holds the bank's lock as the other
    call would while it rewrites, and opens it only once this call waits on
    it (the gate): a record written without the lock would lose a line."""
    bank = tmp_path / "bank"
    env = {**os.environ, "BANK": str(bank), "REPRO_OUT": str(tmp_path), "RUNS": str(tmp_path / "runs"),
           "NAME": "t", "ITERATIONS": "1", "PIECES": "1", "VARIANTS": "direct", "STAGE_COMMAND": "bash -c 'exit 5'",
           "MACHINE": "here"}
    with locked(bank):
        call = subprocess.Popen([str(ROOT / ".venv/bin/python"), "-m", "reproduction.one_call"], env=env,
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while not waits_on_a_lock(call.pid):
                assert call.poll() is None, "the call recorded its stage without waiting for the bank's lock"
                time.sleep(0.05)
            (bank / CALLS).write_text(json.dumps({"call": "agent-r's", "stage": "piece 7/100"}) + "\n")
        except BaseException:
            call.kill()
            raise
    out, err = call.communicate(timeout=120)
    assert call.returncode == 1, out + err
    lines = [json.loads(line) for line in (bank / CALLS).read_text().splitlines()]
    assert [line["call"] for line in lines][0] == "agent-r's" and lines[1]["ended"] == "failed (exit 5)"
