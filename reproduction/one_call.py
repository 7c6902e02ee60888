"""One self-training iteration of a run in pieces, in as many calls of a
short-lived machine as it takes (a GPU machine's 600 s command, a CPU
machine that lasts a few hours): each call restores the bank, runs the stages it has
time for, banks what they finished, and the next call, here or on a fresh
machine, goes on from the bank.

Stages, in order: the pieces of iteration ITERATIONS's search not yet in the
bank (reproduce_paper.sh with PIECE=j/n: search and data of part j of the
train tasks; banked pieces of another n hold their tasks, so n may change
mid-iteration), then the rest (MERGE=n: the banked pieces joined, each variant's
fine-tune, its evals on the test tasks and the revision task, the table).

The budget: the call ends BUDGET_S seconds after it starts, the last
RESERVE_S of them kept for banking. A piece starts only if its estimate
(PIECE_S, or the slowest piece of this call so far) fits in what is left: a
piece cut short loses its trees, and trees are never banked. The last stage
starts whenever time is left and gets SIGINT GRACE_S (20) seconds before the
budget ends (then SIGTERM, then SIGKILL): its fine-tunes bank their step
checkpoints and its evals their episodes, so it resumes. The call's first stage always starts, so every call makes progress.
Each stage adds a line to BANK/calls.jsonl (the machine, the stage, its
seconds, how it ended): the bank's record of which stage ran where.

    TASK=textcraft ITERATIONS=1 PIECES=2 BANK=reproduction/my_run/bank BUDGET_S=540 \\
        python -m reproduction.one_call          # any of reproduce_paper.sh's settings pass through
    make one-call-smollm2 ITERATIONS=3 PIECES=20  # the SmolLM2 run's settings (docs/iterate.md)

Exit codes: 0 the iteration is done and banked; 3 the budget ended first
(call again); 1 a stage failed (its log is in the run's logs/); 2 bad settings.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from agent_r.io import atomic_write_text, locked
from agent_r.manifest import machine
from agent_r.settings import UsageError, run_cli, setup_logging
from reproduction.pieces import bank, piece_name, status

log = logging.getLogger(__name__)

CALLS = "calls.jsonl"   # under the bank: one line per stage of every call
UNFINISHED = 3          # the exit code of a call whose budget ended first


@dataclass
class Call:
    """One call's settings (flags, else the environment reproduce_paper.sh reads)."""
    name: str
    runs: Path
    bank: Path
    iteration: int
    pieces: int
    variants: list[str]
    budget_s: float
    reserve_s: float
    piece_s: float
    command: list[str]
    machine: str
    limit_root: Path   # the run's committed folder, whose size the bank limits (REPRO_OUT)
    grace_s: float = 20.0   # after SIGINT, how long a stage may take to stop (then SIGTERM, then SIGKILL)
    started: float = field(default_factory=time.monotonic)
    id: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))

    def left(self) -> float:
        return self.budget_s - self.reserve_s - (time.monotonic() - self.started)


def machine_name() -> str:
    """The machine, as every eval summary names it (agent_r.manifest.machine)."""
    return machine()


def running_variants(variants: list[str], iteration: int, depths: str) -> list[str]:
    """The variants that run ``iteration`` (VARIANT_ITERATIONS, e.g. good=1, ends some earlier)."""
    last = dict(item.split("=", 1) for item in depths.split(",") if "=" in item)
    return [v for v in variants if int(last.get(v, iteration)) >= iteration]


def pieces_to_run(call: Call) -> list[int]:
    """The pieces whose search and data the bank lacks for some running variant."""
    todo: set[int] = set()
    for variant in call.variants:
        todo |= set(status(call.bank, call.name, call.iteration, call.pieces, variant)[1])
    return sorted(todo)


def record(call: Call, stage: str, seconds: float, ended: str) -> None:
    """Adds the stage's line to the bank's record (rewritten whole, atomically,
    under the bank's lock: calls of two variants may share the bank)."""
    path = call.bank / CALLS
    line = json.dumps({"call": call.id, "machine": call.machine, "stage": stage, "iteration": call.iteration,
                       "variants": call.variants, "seconds": round(seconds, 1), "ended": ended})
    with locked(call.bank):
        old = path.read_text() if path.exists() else ""
        atomic_write_text(path, old + line + "\n")


def run_stage(call: Call, stage: str, env: dict[str, str], run_folder: Path, bank_folder: Path,
              limit: float) -> str:
    """Runs one stage in its own process group under ``limit`` seconds, banks
    what it finished however it ended, records it; returns how it ended."""
    log.info("%s: starting (%.0f s left in the call)", stage, call.left())
    t0 = time.monotonic()
    inherited = {k: v for k, v in os.environ.items() if k not in ("PIECE", "MERGE")}
    started: list[subprocess.Popen] = []
    interrupted = False
    try:
        # inside the try: a signal handled the moment start_stage restores the handlers still stops the stage
        if start_stage(call.command, {**inherited, **env}, started):   # one came while the stage started
            raise KeyboardInterrupt
        proc = started[0]
        rc = proc.wait(timeout=max(limit - call.grace_s, 1))
        ended = "done" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        stop_group(started[0], call.grace_s)
        ended = "budget"
    except KeyboardInterrupt:
        # The stage has a session of its own, so the terminal's Ctrl-C (or a SIGTERM,
        # which run_cli turns into one) reaches this process alone: stop the stage
        # as the budget's end would, or its search runs on with nobody to bank it.
        if started:
            stop_group(started[0], call.grace_s)
        ended, interrupted = "interrupted", True
    seconds = time.monotonic() - t0
    if run_folder.is_dir():   # the stage banks at its own exit; again here, for one cut short
        bank(run_folder, bank_folder, call.limit_root)
    record(call, stage, seconds, ended)
    log.info("%s: %s after %.0f s", stage, ended, seconds)
    if interrupted:
        raise KeyboardInterrupt
    return ended


def start_stage(command: list[str], env: dict[str, str], started: list[subprocess.Popen]) -> bool:
    """Starts the stage in a session of its own and puts its process in
    ``started`` before SIGINT or SIGTERM can raise again; returns whether one
    came while it started. They are held meanwhile, since one raised inside
    Popen, or between Popen and the caller's knowing the process, would leave
    the new stage running, unstopped and unbanked, with no process to stop it."""
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        started.append(subprocess.Popen(command, env=env, start_new_session=True))
    finally:
        restore_handlers(list(previous.items()))
    return bool(held)


def restore_handlers(handlers: list[tuple[int, Any]]) -> None:
    """Each signal's handler back, every one of them even when restoring one
    raises (a pending Ctrl-C is handled the moment its handler is back)."""
    if handlers:
        try:
            signal.signal(*handlers[0])
        finally:
            restore_handlers(handlers[1:])


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT to the stage's process group (the loop stops where it is and keeps what it
    finished), then SIGTERM, then SIGKILL for whatever is left: vLLM's engine, caught
    starting up, turns SIGINT into an error of its own and the loop goes on to the next stage."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:   # the whole group is gone
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig != signal.SIGKILL:   # the stage stopped; anything it left running goes too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        break
    proc.wait()


def run_call(call: Call) -> int:
    """The call's stages within its budget; the exit code (0, UNFINISHED or 1)."""
    call.bank.mkdir(parents=True, exist_ok=True)
    common = {"NAME": call.name, "RUNS": str(call.runs), "BANK": str(call.bank), "ITERATIONS": str(call.iteration),
              "VARIANTS": ",".join(call.variants)}
    slowest, first = call.piece_s, True
    for j in pieces_to_run(call):
        if not first and call.left() < slowest:
            return stop(call, f"piece {j}/{call.pieces} needs ~{slowest:.0f} s, {max(call.left(), 0):.0f} s left")
        piece = piece_name(call.name, call.iteration, j, call.pieces)
        t0 = time.monotonic()
        ended = run_stage(call, f"piece {j}/{call.pieces} of iteration {call.iteration}",
                          {**common, "PIECE": f"{j}/{call.pieces}"}, call.runs / piece, call.bank / "pieces" / piece,
                          call.left())
        if ended == "budget" and first:
            return stop(call, f"piece {j} did not finish in a whole command's budget and runs again from its start: "
                              "cut the search into more pieces (PIECES) or give a command more time (BUDGET_S)")
        if ended == "budget":
            return stop(call, f"piece {j} was cut short: it runs again from its start")
        if ended != "done":
            return failed(call, f"piece {j}/{call.pieces}", ended, call.runs / piece)
        slowest, first = max(slowest, time.monotonic() - t0), False
    if not first and call.left() <= 0:
        return stop(call, "no time left for the fine-tunes and evals")
    ended = run_stage(call, f"merge, fine-tunes and evals of iteration {call.iteration}",
                      {**common, "MERGE": str(call.pieces)}, call.runs / call.name, call.bank, call.left())
    if ended == "budget":
        return stop(call, "the fine-tunes and evals resume from the bank")
    if ended != "done":
        return failed(call, "the merge, fine-tunes and evals", ended, call.runs / call.name)
    print(f"iteration {call.iteration} of {','.join(call.variants)} done and banked in {call.bank} "
          f"({time.monotonic() - call.started:.0f} s; record: {call.bank / CALLS})")
    return 0


def stop(call: Call, why: str) -> int:
    print(f"budget: {why}; banked in {call.bank}: call again to go on")
    return UNFINISHED


def failed(call: Call, what: str, ended: str, run_folder: Path) -> int:
    print(f"{what} {ended}: its logs are in {run_folder / 'logs'}; what it finished is banked in {call.bank}, "
          "and the same command again retries the rest")
    return 1


def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m reproduction.one_call", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default=env("NAME", "repro_paper"), help="the run (NAME)")
    p.add_argument("--runs", default=env("RUNS", "runs"), help="the runs folder (RUNS)")
    p.add_argument("--bank", default=env("BANK"), help="the run's bank folder (BANK), required")
    p.add_argument("--iteration", type=int, default=int(env("ITERATIONS", "0") or 0), help="(ITERATIONS) >= 1")
    p.add_argument("--pieces", type=int, default=int(env("PIECES", "1") or 1), help="search pieces (PIECES)")
    p.add_argument("--variants", default=env("VARIANTS", "agent-r,direct,good"), help="(VARIANTS)")
    p.add_argument("--budget_s", type=float, default=float(env("BUDGET_S", "540")), help="the call's seconds")
    p.add_argument("--reserve_s", type=float, default=float(env("RESERVE_S", "30")), help="kept for banking")
    p.add_argument("--piece_s", type=float, default=float(env("PIECE_S", "0")),
                   help="a piece's seconds before one is measured (0: any piece starts)")
    p.add_argument("--grace_s", type=float, default=float(env("GRACE_S", "20")),
                   help="seconds a stage cut by the budget gets to stop after SIGINT")
    p.add_argument("--command", default=env("STAGE_COMMAND", "bash reproduction/reproduce_paper.sh"),
                   help="what runs a stage, reading PIECE/MERGE/BANK from the environment")
    args = p.parse_args(argv)
    setup_logging()
    if not args.bank:
        raise UsageError("BANK is not set: the folder the run's state is banked in (e.g. reproduction/my_run/bank)")
    if args.iteration < 1:
        raise UsageError(f"ITERATIONS={args.iteration}: set the iteration this call works on (1, 2, 3, ...)")
    if args.pieces < 1:
        raise UsageError(f"PIECES={args.pieces}: the search is cut into at least 1 piece")
    variants = running_variants([v for v in args.variants.split(",") if v], args.iteration,
                                env("VARIANT_ITERATIONS", ""))
    if not variants:
        raise UsageError(f"no variant of VARIANTS={args.variants} runs iteration {args.iteration} "
                         "(VARIANT_ITERATIONS ends them earlier)")
    call = Call(name=args.name, runs=Path(args.runs), bank=Path(args.bank), iteration=args.iteration,
                pieces=args.pieces, variants=variants, budget_s=args.budget_s, reserve_s=args.reserve_s,
                piece_s=args.piece_s, command=shlex.split(args.command), machine=env("MACHINE") or machine_name(),
                limit_root=Path(env("REPRO_OUT") or f"reproduction/{args.name}"), grace_s=args.grace_s)
    return run_call(call)


if __name__ == "__main__":
    run_cli(main)
