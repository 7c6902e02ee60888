"""The one settings path: every setting of every script is a dataclass field.

A field says where its value may come from (a command-line flag, an
environment variable, or both), what it means and its smallest legal value.
``parse`` resolves each field as flag > environment variable > default,
validates it with one sentence that names the setting and the fix, builds
``--help`` from the same fields, and the settings object itself is the run
manifest's config (``manifest_config``). Adding a setting costs one field.

This module is the machinery only: ``setting``, the per-iteration
``Schedule`` values, ``parse``/``build_parser``/``validate``,
``manifest_config``, logging and ``run_cli`` with its exit codes. The fields
themselves live with what reads them. Each environment variable is declared by
one field. Knobs several scripts read are grouped (``ModelDir``,
``BackendSettings``, ``ShardSettings`` and the search and pairing knobs in
agent_r/knobs.py, the training knobs in agent_r/training/settings.py): a
script's settings class includes a group's fields (dataclass inheritance, so
attribute names and manifests stay flat) or nests the whole group (``nested``,
as iterate.py does).

This is the only module below the scripts that reads ``os.environ``: library
code receives settings objects, so a test sets values by constructing them.

Why not pydantic-settings or jsonargparse: the reference's interface mixes
upper-case env vars whose names differ from the flag (``TEMP``, ``ITERA``),
flags without env vars, env vars without flags, a positional sub-command
(``path_collection.py export``) and defaults that depend on another setting
(MAX_DEPTH per TASK). Both libraries can express most of that, but their
validation errors are multi-line reports and their env/flag naming rules
would need a custom source per field; ~150 lines of stdlib keep the
reference's names and the one-line errors exactly.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import types
import typing
from dataclasses import MISSING, field, fields
from typing import Any, Callable, Mapping, TypeVar

T = TypeVar("T")
SECRET = "***"


class UsageError(Exception):
    """A mistake in how the user invoked a script (bad env var, flag, file).

    Scripts catch it at top level and print only the message (exit code 2).
    """


# --------------------------------------------------------------------------- fields

def setting(default: Any = MISSING, *, help: str, env: str | None = None, flag: str | bool | None = True,
            minimum: float | None = None, choices: tuple | None = None, secret: bool = False,
            default_factory: Any = MISSING, schedule: bool = False) -> Any:
    """A settings field. ``flag=True`` means ``--<field name>``; a string names
    the flag; None means environment-only. ``secret`` values never reach a
    manifest, a log or an error message. ``schedule``: a number that may also
    be given per iteration, comma-separated (``Schedule``)."""
    meta = {"help": help, "env": env, "flag": flag, "minimum": minimum, "choices": choices, "secret": secret,
            "schedule": schedule}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


class Schedule:
    """A number given per iteration of the self-training loop: ``EPOCHS=3,1,1``
    is 3 in iteration 1, then 1 (the last value holds for every later
    iteration). It is also the number itself, its FIRST value (``IntSchedule``
    is an int, ``FloatSchedule`` a float), so a script that runs one iteration
    (path_collection.py, the trainers) reads a schedule as it reads one value,
    and JSON writes it as that value. ``str`` gives the comma list back, the
    form the environment variable takes. A single value is never a Schedule:
    it parses to the plain number, as before schedules existed."""

    values: tuple

    def at(self, k: int) -> Any:
        """The value of iteration ``k`` (1-based)."""
        return self.values[min(max(k, 1), len(self.values)) - 1]

    def __str__(self) -> str:
        return ",".join(str(v) for v in self.values)

    __repr__ = __str__

    def __reduce__(self) -> tuple:   # copy and pickle keep the whole list
        return type(self), (self.values,)


class IntSchedule(Schedule, int):
    def __new__(cls, values: tuple | list) -> "IntSchedule":
        obj = int.__new__(cls, values[0])
        obj.values = tuple(int(v) for v in values)
        return obj


class FloatSchedule(Schedule, float):
    def __new__(cls, values: tuple | list) -> "FloatSchedule":
        obj = float.__new__(cls, values[0])
        obj.values = tuple(float(v) for v in values)
        return obj


def at_iteration(value: Any, k: int) -> Any:
    """``value`` in iteration ``k``: a Schedule's k-th value as a plain
    number, anything else unchanged."""
    return value.at(k) if isinstance(value, Schedule) else value


def nested(cls: type) -> Any:
    """A group of settings (e.g. the model backend's) inside a script's settings."""
    return field(default_factory=cls, metadata={"nested": True})


def _flag_name(f: dataclasses.Field) -> str | None:
    flag = f.metadata.get("flag")
    if flag is True:
        return f"--{f.name}"
    return flag or None


def _dest(f: dataclasses.Field) -> str | None:
    """The parsed-flag key of a field: its flag's name, so two groups may hold
    env-only fields of the same name (iterate.py's ITERATIONS and ITERA)."""
    flag = _flag_name(f)
    return flag.lstrip("-") if flag else None


def _leaf_fields(cls: type) -> list[tuple[type, dataclasses.Field]]:
    out = []
    for f in fields(cls):
        if f.metadata.get("nested"):
            out.extend(_leaf_fields(_field_type(cls, f)))
        else:
            out.append((cls, f))
    return out


def _field_type(cls: type, f: dataclasses.Field) -> Any:
    return typing.get_type_hints(cls)[f.name]


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(int|float|str|bool, optional?) of an annotation like ``int | None``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _source(f: dataclasses.Field, via: str) -> str:
    return _flag_name(f) if via == "flag" else f.metadata["env"]


def _convert(cls: type, f: dataclasses.Field, raw: str, via: str) -> Any:
    tp, optional = _base_type(_field_type(cls, f))
    name, meaning = _source(f, via), f.metadata["help"].split(" (default")[0]
    shown = SECRET if f.metadata.get("secret") else repr(raw)
    if optional and raw.strip().lower() in ("", "none"):
        return None
    if f.metadata.get("schedule") and "," in raw:
        return _schedule(cls, f, raw, via, tp)
    try:
        if tp is bool:
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError
            value: Any = low in ("1", "true", "yes")
        elif tp in (int, float):
            value = tp(raw.strip())
            if value != value:  # NaN
                raise ValueError
        else:
            value = raw.strip() if via == "env" else raw
    except ValueError:
        kind = {bool: "0 or 1", int: "an integer", float: "a number"}.get(tp, "valid")
        raise UsageError(f"{name}={shown} is not {kind}: it is {meaning}.") from None
    return _check(f, name, value, meaning)


def _schedule(cls: type, f: dataclasses.Field, raw: str, via: str, tp: Any) -> Schedule:
    """A comma list of a schedule field, each value converted and checked."""
    name, meaning = _source(f, via), f.metadata["help"].split(" (default")[0]
    kind = "an integer" if tp is int else "a number"
    try:
        values = [tp(p.strip()) for p in raw.split(",")]
        if any(v != v for v in values):  # NaN
            raise ValueError
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not {kind} or a comma list of them (one per iteration, e.g. "
                         f"3,1,1): it is {meaning}.") from None
    return _check(f, name, (IntSchedule if tp is int else FloatSchedule)(values), meaning)


def _check(f: dataclasses.Field, name: str, value: Any, meaning: str) -> Any:
    if isinstance(value, Schedule):
        for v in value.values:
            _check(f, name, v, meaning)
        return value
    minimum, choices = f.metadata.get("minimum"), f.metadata.get("choices")
    if minimum is not None and value is not None and value < minimum:
        raise UsageError(f"{name}={value} is too small: it is {meaning} and must be >= {minimum:g}.")
    if choices and value is not None and value not in choices:
        raise UsageError(f"{name}={value!r} is not one of {', '.join(map(str, choices))}: it is {meaning}.")
    return value


# --------------------------------------------------------------------------- parsing

def build_parser(cls: type, description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """Flags for every flag field; the epilog lists every environment variable."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=env_help(cls),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for owner, f in _leaf_fields(cls):
        flag = _flag_name(f)
        if flag:
            env = f" [env {f.metadata['env']}]" if f.metadata.get("env") else ""
            nargs = "+" if typing.get_origin(_base_type(_field_type(owner, f))[0]) is list else None
            p.add_argument(flag, dest=_dest(f), default=None, nargs=nargs, metavar=f.name.upper(),
                           help=f.metadata["help"] + env)
    return p


def env_help(cls: type) -> str:
    rows = [(f.metadata["env"], f.metadata["help"] + (f" [flag {_flag_name(f)}]" if _flag_name(f) else ""))
            for _, f in _leaf_fields(cls) if f.metadata.get("env")]
    if not rows:
        return ""
    width = max(len(name) for name, _ in rows)
    return "environment variables (a flag, when given, wins):\n" + "\n".join(
        f"  {name.ljust(width)}  {text}" for name, text in rows)


def parse(cls: type[T], argv: list[str] | None = None, environ: Mapping[str, str] | None = None,
          description: str = "", prog: str | None = None) -> T:
    """Settings of type ``cls`` from ``argv`` (default sys.argv[1:]) and
    ``environ`` (default os.environ); flag > env var > default. Calls the
    object's ``finish()`` (cross-field defaults and checks) when it has one."""
    environ = os.environ if environ is None else environ
    parser = build_parser(cls, description, prog)
    try:
        args = vars(parser.parse_args(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        raise UsageError("bad command line (see the message above and --help)") from None
    return _build(cls, args, environ)


def _build(cls: type[T], args: dict[str, Any], environ: Mapping[str, str]) -> T:
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("nested"):
            values[f.name] = _build(_field_type(cls, f), args, environ)
            continue
        dest, env = _dest(f), f.metadata.get("env")
        raw = args.get(dest) if dest else None
        if isinstance(raw, list):
            values[f.name] = raw
        elif raw is not None:
            values[f.name] = _convert(cls, f, raw, "flag")
        elif env and environ.get(env, "").strip():
            values[f.name] = _convert(cls, f, environ[env], "env")
    obj = cls(**values)
    finish = getattr(obj, "finish", None)
    if callable(finish):
        finish()
    return obj


def validate(obj: Any) -> None:
    """The same minimum/choices checks for a settings object built in code."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("nested"):
            validate(value)
        elif "help" in f.metadata:
            name = _flag_name(f) or f.metadata.get("env") or f.name
            _check(f, name, value, f.metadata["help"].split(" (default")[0])


def manifest_config(obj: Any) -> dict[str, Any]:
    """Every setting's resolved value (``asdict``), secrets masked."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("nested"):
            out[f.name] = manifest_config(value)
        elif f.metadata.get("secret") and value:
            out[f.name] = SECRET
        elif isinstance(value, Schedule):
            out[f.name] = list(value.values)
        else:
            out[f.name] = value
    return out


# --------------------------------------------------------------------------- running a script

EXIT_OK, EXIT_ITEMS_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def setup_logging(environ: Mapping[str, str] | None = None) -> None:
    # vLLM (and its engine processes) log to stdout unless told otherwise; keep stdout for results
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    level = (os.environ if environ is None else environ).get("LOGLEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


_SIGNALLED: list[int] = []


def _interrupt(signum: int, frame: Any) -> None:
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def raise_if_signalled() -> None:
    """Raise the interrupt again when a SIGTERM arrived and a library swallowed
    it: pyzmq's poll does, while vLLM waits for its engine to start, and the run
    would go on. Call it after such a wait."""
    if _SIGNALLED:
        raise KeyboardInterrupt(f"signal {_SIGNALLED[-1]}")


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's main() under the one exit-code rule of every script:
    0 everything done; 1 some item failed for good in this run (a rerun retries
    it); 2 a usage error or an unreachable server (one line, no traceback);
    130 interrupted by Ctrl-C or SIGTERM (finished outputs are kept). Errors
    that are the user's to fix (UsageError, or any exception class with
    ``user_facing = True``) print one line; anything else is a bug and keeps
    its traceback.

    SIGTERM (``kill``, a scheduler's time limit or ``scancel``) is turned into
    the Ctrl-C path: Python's default dies on it without running finally
    blocks or atexit, which leaves vLLM's engine process running alone and
    holding the CPU or GPU."""
    setup_logging()
    in_main_thread = threading.current_thread() is threading.main_thread()
    _SIGNALLED.clear()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main_thread else None
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted; finished outputs are kept, rerun the same command to resume", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - filtered below
        if isinstance(exc, UsageError) or getattr(exc, "user_facing", False):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(EXIT_USAGE)
        raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    sys.exit(code or EXIT_OK)
