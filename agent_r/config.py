"""Environment-variable parsing that fails with a sentence, not a traceback.

The reference scripts read their configuration from environment variables set
by cluster shell scripts; a typo there should produce one line that names the
variable, what it means and how to fix it.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable


class UsageError(Exception):
    """A mistake in how the user invoked a script (bad env var, flag, file).

    Scripts catch it at top level and print only the message (exit code 2).
    """


def _raw(name: str, meaning: str, default: str | None) -> str:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        if default is None:
            raise UsageError(
                f"environment variable {name} is not set: it is {meaning}. "
                f"Set it, e.g. `export {name}=...`."
            )
        return default
    return value.strip()


def env_str(name: str, meaning: str, default: str | None = None) -> str:
    return _raw(name, meaning, default)


def env_int(name: str, meaning: str, default: int | None = None, minimum: int | None = None) -> int:
    raw = _raw(name, meaning, None if default is None else str(default))
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer: it is {meaning}.") from None
    if minimum is not None and value < minimum:
        raise UsageError(f"{name}={value} is too small: it is {meaning} and must be >= {minimum}.")
    return value


def env_float(name: str, meaning: str, default: float | None = None, minimum: float | None = None) -> float:
    raw = _raw(name, meaning, None if default is None else repr(default))
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number: it is {meaning}.") from None
    if value != value:  # NaN
        raise UsageError(f"{name}={raw!r} is not a number: it is {meaning}.")
    if minimum is not None and value < minimum:
        raise UsageError(f"{name}={value} is too small: it is {meaning} and must be >= {minimum}.")
    return value


def setup_logging() -> None:
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's main(); user mistakes print one line and exit 2.

    Errors that are the user's to fix (UsageError, and any exception class that
    sets ``user_facing = True``, such as an unreachable env server) are shown
    without a traceback. Anything else is a bug and keeps its traceback.
    """
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted; finished outputs are kept, rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - filtered below
        if isinstance(exc, UsageError) or getattr(exc, "user_facing", False):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        raise
    sys.exit(code or 0)
