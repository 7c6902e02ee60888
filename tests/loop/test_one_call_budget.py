"""reproduction/one_call.py's budget rules, each held on its own: a call's
stages never run into the seconds kept for banking; its first piece always
starts; a piece's measured time raises the estimate the next piece must fit;
a call cut by its budget says "call again", not "failed"; a stage cut by the
budget gets SIGINT, then SIGTERM, then SIGKILL; a stage cut short however it
ended is banked by the call; and PIECE or MERGE in the caller's environment
never reaches a stage it was not meant for.

The clock is the test's: ``one_call.time`` is replaced by a clock that moves
only when a stage "runs", so no rule here races the wall clock. The signal
test holds the stage at a known point (it says when its handlers are in)
before it is stopped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from reproduction import one_call
from reproduction.one_call import Call

CALL_AGAIN = 3   # the documented exit code (Makefile, docs/iterate.md), not the module's constant


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(one_call, "time", SimpleNamespace(monotonic=c.monotonic))
    return c


def a_call(tmp_path: Path, budget_s: float, reserve_s: float = 0.0, piece_s: float = 0.0, pieces: int = 3,
           command: list[str] | None = None) -> Call:
    """A call that starts now on whichever clock one_call reads (the test's, where the test set one)."""
    return Call(name="t", runs=tmp_path / "runs", bank=tmp_path / "bank", iteration=1, pieces=pieces,
                variants=["agent-r"], budget_s=budget_s, reserve_s=reserve_s, piece_s=piece_s,
                command=command or ["true"], machine="the test box", limit_root=tmp_path / "results", grace_s=1.0,
                started=one_call.time.monotonic())


def stages_that_take(monkeypatch, clock: Clock, seconds: dict[str, float], ends: dict[str, str] | None = None):
    """run_stage replaced: each stage "runs" for its seconds on the test's clock and ends as told; returns the log."""
    seen = []

    def fake(call, stage, env, run_folder, bank_folder, limit):
        seen.append({"stage": stage, "limit": limit, "left_after_reserve": call.budget_s - call.reserve_s
                     - (clock.now - call.started), "env": env})
        kind = "merge" if stage.startswith("merge") else "piece"
        clock.now += seconds.get(kind, 0.0)
        return (ends or {}).get(kind, "done")

    monkeypatch.setattr(one_call, "run_stage", fake)
    return seen


def test_no_stage_may_run_into_the_seconds_kept_for_banking(tmp_path, clock, monkeypatch):
    seen = stages_that_take(monkeypatch, clock, {"piece": 10})
    assert one_call.run_call(a_call(tmp_path, budget_s=2000, reserve_s=1500)) == 0
    assert seen and all(s["limit"] <= s["left_after_reserve"] <= 500 for s in seen), seen


def test_the_first_piece_starts_even_when_the_call_has_less_time_than_a_pieces_estimate(tmp_path, clock,
                                                                                        monkeypatch, capsys):
    seen = stages_that_take(monkeypatch, clock, {"piece": 5})
    assert one_call.run_call(a_call(tmp_path, budget_s=100, piece_s=10_000)) == CALL_AGAIN
    assert [s["stage"] for s in seen] == ["piece 1/3 of iteration 1"]   # the first, and no other
    assert "call again" in capsys.readouterr().out


def test_a_pieces_measured_time_raises_the_estimate_the_next_piece_must_fit(tmp_path, clock, monkeypatch):
    seen = stages_that_take(monkeypatch, clock, {"piece": 50})
    # 120 s: piece 1 takes 50 (70 left >= 50), piece 2 takes 50 (20 left < 50): piece 3 must wait
    assert one_call.run_call(a_call(tmp_path, budget_s=120, piece_s=0)) == CALL_AGAIN
    assert [s["stage"] for s in seen] == ["piece 1/3 of iteration 1", "piece 2/3 of iteration 1"]


@pytest.mark.parametrize("where", ["merge", "piece"])
def test_a_call_cut_by_its_budget_says_call_again_not_failed(tmp_path, clock, monkeypatch, capsys, where):
    stages_that_take(monkeypatch, clock, {"piece": 1}, ends={where: "budget"})
    pieces = 1 if where == "merge" else 3
    code = one_call.run_call(a_call(tmp_path, budget_s=10_000, pieces=pieces))
    out = capsys.readouterr().out
    assert code == CALL_AGAIN and "call again" in out and "failed" not in out


def test_a_stage_that_fails_is_failed_not_unfinished(tmp_path, clock, monkeypatch, capsys):
    stages_that_take(monkeypatch, clock, {}, ends={"merge": "failed (exit 1)"})
    assert one_call.run_call(a_call(tmp_path, budget_s=10_000, pieces=1)) == 1
    assert "call again" not in capsys.readouterr().out


# --------------------------------------------------------------------------- real stage processes

STAGE = """
import json, os, signal, sys, time
out = sys.argv[1]
got = []
def note(signum, frame):
    got.append(signal.Signals(signum).name)
    open(out, "w").write(json.dumps(got))
signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
open(out + ".ready", "w").write("ready")
while True:
    time.sleep(0.05)
"""


def test_a_stage_cut_by_the_budget_gets_sigint_then_sigterm_then_sigkill(tmp_path):
    """The loop's stop first (SIGINT keeps what finished), then SIGTERM, then SIGKILL."""
    out = tmp_path / "signals.json"
    proc = subprocess.Popen([sys.executable, "-c", STAGE, str(out)], start_new_session=True)
    try:
        while not (tmp_path / "signals.json.ready").exists():   # the gate: the stage says its handlers are in
            assert proc.poll() is None, "the stage ended before it was stopped"
            time.sleep(0.01)
        one_call.stop_group(proc, grace_s=0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads(out.read_text()) == ["SIGINT", "SIGTERM"]
    assert proc.returncode == -signal.SIGKILL


def recording_stage(tmp_path: Path, exit_code: int) -> list[str]:
    """A stage command that writes the PIECE and MERGE it was given, then exits ``exit_code``."""
    script = ("import json, os, sys; from pathlib import Path; p = Path(sys.argv[1]); p.mkdir(parents=True, "
              "exist_ok=True); n = len(list(p.glob('*.json'))); (p / f'{n}.json').write_text(json.dumps("
              "{k: os.environ.get(k) for k in ('PIECE', 'MERGE')})); sys.exit(int(sys.argv[2]))")
    return [sys.executable, "-c", script, str(tmp_path / "seen"), str(exit_code)]


def stage_envs(tmp_path: Path) -> list[dict]:
    return [json.loads((tmp_path / "seen" / f"{i}.json").read_text())
            for i in range(len(list((tmp_path / "seen").glob("*.json"))))]


def test_piece_or_merge_in_the_callers_environment_never_reaches_another_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("PIECE", "9/9")
    monkeypatch.setenv("MERGE", "7")
    monkeypatch.setattr(one_call, "bank", lambda *a, **k: 0)
    assert one_call.run_call(a_call(tmp_path, budget_s=10_000, pieces=2, command=recording_stage(tmp_path, 0))) == 0
    assert stage_envs(tmp_path) == [{"PIECE": "1/2", "MERGE": None}, {"PIECE": "2/2", "MERGE": None},
                                    {"PIECE": None, "MERGE": "2"}]


@pytest.mark.parametrize("how", ["failure", "budget", "interrupt"])
def test_a_stage_cut_short_is_banked_by_the_call(tmp_path, monkeypatch, how):
    banked = []
    monkeypatch.setattr(one_call, "bank", lambda run, bank, limit_root: banked.append((run, bank)) or 0)
    run_folder = tmp_path / "runs" / "t"
    run_folder.mkdir(parents=True)
    (tmp_path / "bank").mkdir()
    call = a_call(tmp_path, budget_s=10_000, pieces=1,
                  command=recording_stage(tmp_path, 1) if how == "failure" else ["sleep", "600"])
    if how == "interrupt":
        real_popen = subprocess.Popen

        class Interrupted(real_popen):   # the terminal's Ctrl-C arrives once, while the call waits on its stage
            interrupted = False

            def wait(self, timeout=None):
                if not Interrupted.interrupted:
                    Interrupted.interrupted = True
                    raise KeyboardInterrupt
                return super().wait(timeout)

        monkeypatch.setattr(one_call.subprocess, "Popen", Interrupted)
        with pytest.raises(KeyboardInterrupt):
            one_call.run_stage(call, "merge", {}, run_folder, tmp_path / "bank", limit=10_000)
    else:
        # the budget case: a limit the stage (which never ends by itself) cannot meet
        ended = one_call.run_stage(call, "merge", {}, run_folder, tmp_path / "bank",
                                   limit=10_000 if how == "failure" else call.grace_s + 1)
        assert ended == ("failed (exit 1)" if how == "failure" else "budget")
    assert banked == [(run_folder, tmp_path / "bank")]
    record = (tmp_path / "bank" / one_call.CALLS).read_text().splitlines()
    assert json.loads(record[-1])["ended"] == {"failure": "failed (exit 1)", "budget": "budget",
                                               "interrupt": "interrupted"}[how]


def test_a_ctrl_c_while_the_stage_starts_still_stops_and_banks_it(tmp_path, monkeypatch):
    """The signal lands while Popen starts the stage (the stage already runs): the call must
    still stop that stage and record it, not leave it running with nobody to bank it."""
    banked = []
    monkeypatch.setattr(one_call, "bank", lambda run, bank, limit_root: banked.append(run) or 0)
    (tmp_path / "runs" / "t").mkdir(parents=True)
    (tmp_path / "bank").mkdir()
    real_popen = subprocess.Popen
    started = []

    class SignalledWhileStarting(real_popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.pid)
            os.kill(os.getpid(), signal.SIGINT)   # delivered before Popen returns

    monkeypatch.setattr(one_call.subprocess, "Popen", SignalledWhileStarting)
    call = a_call(tmp_path, budget_s=10_000, pieces=1, command=["sleep", "600"])
    with pytest.raises(KeyboardInterrupt):
        one_call.run_stage(call, "merge", {}, tmp_path / "runs" / "t", tmp_path / "bank", limit=10_000)
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0], 0)   # the stage's whole group is gone
    assert banked == [tmp_path / "runs" / "t"]
    assert json.loads((tmp_path / "bank" / one_call.CALLS).read_text().splitlines()[-1])["ended"] == "interrupted"


def test_a_ctrl_c_handled_as_the_handlers_come_back_still_stops_the_stage(tmp_path, monkeypatch):
    """A signal that came during Popen may be handled only once the usual
    handler is back, as KeyboardInterrupt right after start_stage restores it:
    the stage already runs then, and the call must still know it and stop it."""
    banked = []
    monkeypatch.setattr(one_call, "bank", lambda run, bank, limit_root: banked.append(run) or 0)
    (tmp_path / "runs" / "t").mkdir(parents=True)
    (tmp_path / "bank").mkdir()
    real_signal, usual, usual_term = signal.signal, signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    restored = []

    def signal_then_interrupt(signum, handler):
        old = real_signal(signum, handler)
        if signum == signal.SIGINT and handler is usual:   # the restore: the pending Ctrl-C is handled now
            restored.append(signum)
            raise KeyboardInterrupt
        return old

    real_popen, started = subprocess.Popen, []

    class Recorded(real_popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    monkeypatch.setattr(one_call.signal, "signal", signal_then_interrupt)
    monkeypatch.setattr(one_call.subprocess, "Popen", Recorded)
    call = a_call(tmp_path, budget_s=10_000, pieces=1, command=["sleep", "600"])
    try:
        with pytest.raises(KeyboardInterrupt):
            one_call.run_stage(call, "merge", {}, tmp_path / "runs" / "t", tmp_path / "bank", limit=10_000)
        assert restored and started
        assert signal.getsignal(signal.SIGTERM) is usual_term   # restored too, though SIGINT's restore raised
        with pytest.raises(ProcessLookupError):
            os.killpg(started[0], 0)   # the stage's whole group is gone
    finally:
        for pid in started:   # never leave a sleep behind when the call did
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        real_signal(signal.SIGTERM, usual_term)
    assert banked == [tmp_path / "runs" / "t"]
    assert json.loads((tmp_path / "bank" / one_call.CALLS).read_text().splitlines()[-1])["ended"] == "interrupted"
