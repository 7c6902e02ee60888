"""Atomic writes: a killed run never leaves a partial output file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str, errors: str = "strict") -> None:
    """Write via a temp file in the same folder + rename. The file gets the
    permissions a plain open() would give (mkstemp's 0600 would hide trees from
    the rest of a cluster group). ``errors`` is the UTF-8 encoder's policy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors=errors) as f:
            f.write(text)
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


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 4) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", errors=_JSON_ERRORS)


def atomic_write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), errors=_JSON_ERRORS)


def read_json(path: str | os.PathLike) -> Any:
    """Load JSON; raises ValueError naming the file when it is corrupt."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: corrupt JSON ({exc})") from None
