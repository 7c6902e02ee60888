"""Atomic writes: a killed run never leaves a partial output file; JSON is
always strict (no NaN/Infinity), so any parser can read what we write."""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str, errors: str = "strict") -> None:
    """Write via a temp file in the same folder + rename. The file gets the
    permissions a plain open() would give (mkstemp's 0600 would hide trees from
    the rest of a cluster group). ``errors`` is the UTF-8 encoder's policy."""
    _atomic_write(path, text, lambda fd: os.fdopen(fd, "w", encoding="utf-8", errors=errors))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """``atomic_write_text`` for bytes (a banked adapter's weights)."""
    _atomic_write(path, data, lambda fd: os.fdopen(fd, "wb"))


def _atomic_write(path: str | os.PathLike, payload: Any, opener: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with opener(fd) as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# A lone surrogate (e.g. "\ud800" sent escaped by a model server) cannot be
# encoded as UTF-8; written back as its \uXXXX escape it stays valid JSON
# and reads back as the same string. It can only occur inside JSON strings.
_JSON_ERRORS = "backslashreplace"


def strict_json(obj: Any, indent: int | None = None, where: str = "") -> str:
    """``obj`` as strict JSON (RFC 8259). Python's json writes NaN and Infinity
    as bare words that JavaScript, Go, Rust and Jackson parsers reject, so a
    non-finite float is refused here, naming where it sits, instead of
    producing a file other tools cannot read."""
    try:
        return json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        bad = first_non_finite(obj)
        if bad is None:
            raise
        raise ValueError(f"{where or 'JSON output'}: {bad} is not a finite number; strict JSON has no "
                         "NaN/Infinity") from exc


def first_non_finite(obj: Any, path: str = "$") -> str | None:
    """JSON path and value of the first NaN/Infinity inside ``obj``, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"{path} = {obj}"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = first_non_finite(value, f"{path}[{key!r}]" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found
    return None


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 4) -> None:
    atomic_write_text(path, strict_json(obj, indent, where=str(path)) + "\n", errors=_JSON_ERRORS)


def atomic_write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> None:
    text = "".join(strict_json(r, where=f"{path} row {n}") + "\n" for n, r in enumerate(rows, start=1))
    atomic_write_text(path, text, errors=_JSON_ERRORS)


def read_json(path: str | os.PathLike) -> Any:
    """Load JSON; raises ValueError naming the file when it is corrupt."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: corrupt JSON ({exc})") from None


def file_sha256(path: str | os.PathLike) -> str:
    """A file's content hash, read in 1 MiB blocks: what resume checks compare
    (a tree's revision part, a fine-tune's data files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def locked(folder: str | os.PathLike) -> Iterator[None]:
    """An exclusive lock on a folder (made if missing), held by this process until
    the block ends: two processes that read, change and rewrite one file in it take
    turns. No lock file is left behind."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # releases the lock
