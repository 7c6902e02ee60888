"""Rewrites the absolute paths that committed JSON artefacts carry from the
machine that made them, as the writers now record paths (``agent_r.paths.
portable``): a file of a run relative to the run's folder, anything else in
the repository relative to the repository.

    python -m scripts.portable_artefacts            # rewrite in place; prints what changed
    python -m scripts.portable_artefacts --check    # exit 1 if any tracked artefact holds one

Which files: every tracked ``*.json`` under bench/, models/ and
reproduction/, and the summary.json, results.json and manifest members of
the reproduction banks' archives, state and episodes (what a restored run
copies back). Only path strings change, in place in the text, so
every number and the formatting stay as they were. Kept because files written before the writers changed (and banks
made by an older checkout) are fixed by running it again; it is idempotent.

What a path becomes, for a file of the run ``<run>`` (under
reproduction/<run>/, or a bank of that run or of its pieces):
``.../runs/<run>/iter_1/x`` -> ``iter_1/x``; elsewhere the part from the
first folder the repository has at its top (``/work/main/models/m`` ->
``models/m``, ``/scratch/runs`` -> ``runs``); a path that names none of
those is left as it is and reported.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from agent_r.io import atomic_write_bytes
from agent_r.paths import REPOSITORY
from reproduction.pieces import ARCHIVE, EPISODES, packed

# a JSON string literal that is an absolute POSIX path of two or more folders (or a comma list of them)
ABSOLUTE = re.compile(r'"(/[^"\\/\s]+/(?:[^"\\]|\\.)*)"')
NOT_ARTEFACTS = ("tokenizer.json", "tokenizer_config.json", "vocab.json")   # a model's vocabulary, not paths
TOP = {"models", "runs", "bench", "reproduction", "work_dirs", "test_result", "demo_output", "mcts_result", "revise_data",
       "scripts", "tests", "agent_r"}
BANK_MEMBERS = ("summary.json", "results.json")
MANIFEST_MEMBER = re.compile(r"manifest(\.[\w-]+)?\.json")   # a run's or a shard's manifest (its backend's model folder)


def rewrite_path(path: str, run: str | None) -> str | None:
    """The portable form of one absolute path, or None when it names nothing known."""
    parts = Path(path).parts[1:]
    if run:
        for i in range(len(parts) - 1):
            if parts[i] == "runs" and parts[i + 1] == run:
                return "/".join(parts[i + 2:]) or "."
    for i, part in enumerate(parts):
        if part in TOP:
            return "/".join(parts[i:])
    return None


def rewrite_text(text: str, run: str | None, where: str, unknown: list[str]) -> str:
    def one(match: re.Match) -> str:
        pieces = []
        for piece in match.group(1).split(","):
            new = rewrite_path(piece, run) if piece.startswith("/") else piece
            if new is None:
                unknown.append(f"{where}: {piece}")
                new = piece
            pieces.append(new)
        return json.dumps(",".join(pieces))

    return ABSOLUTE.sub(one, text)


def run_of(path: Path) -> str | None:
    """The run whose files ``path`` holds: reproduction/<run>/..., its
    bank, or a piece's bank (the piece is a run of its own)."""
    if not path.is_relative_to(REPOSITORY):
        return None
    parts = path.relative_to(REPOSITORY).parts
    if parts[0] != "reproduction" or len(parts) < 3:
        return None
    if "pieces" in parts:
        return parts[parts.index("pieces") + 1]
    return parts[1]


def tracked(patterns: list[str], root: Path = REPOSITORY) -> list[Path]:
    """The files git tracks or is about to (staged or not; a bank's new
    summaries are checked before their commit), that are on disk."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
                         cwd=root, capture_output=True, text=True, check=True)
    return [root / line for line in out.stdout.splitlines() if line and (root / line).is_file()]


def fix_json(path: Path, check: bool, unknown: list[str]) -> bool:
    text = path.read_text(encoding="utf-8")
    new = rewrite_text(text, run_of(path), str(path.relative_to(REPOSITORY)), unknown)
    if new != text and not check:
        path.write_text(new, encoding="utf-8")
    return new != text


def fix_bank(archive: Path, check: bool, unknown: list[str]) -> bool:
    with tarfile.open(archive, "r:gz") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    changed, out = False, []
    for name, data in members:
        if Path(name).name in BANK_MEMBERS or MANIFEST_MEMBER.fullmatch(Path(name).name):
            text = data.decode("utf-8")
            where = archive.relative_to(REPOSITORY) if archive.is_relative_to(REPOSITORY) else archive
            new = rewrite_text(text, run_of(archive), f"{where}:{name}", unknown)
            changed |= new != text
            data = new.encode("utf-8")
        out.append((name, data))
    if changed and not check:
        atomic_write_bytes(archive, packed(out))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = parser.parse_args(argv)
    unknown: list[str] = []
    artefacts = [p for p in tracked(["bench/*.json", "models/*.json", "reproduction/*.json"])
                 if p.name not in NOT_ARTEFACTS]
    changed = [p for p in artefacts if fix_json(p, args.check, unknown)]
    changed += [p for p in tracked([f"reproduction/*/{ARCHIVE}", f"reproduction/*/{EPISODES}/*.tar.gz"])
                if fix_bank(p, args.check, unknown)]
    for path in changed:
        print(f"{'would rewrite' if args.check else 'rewrote'} {path.relative_to(REPOSITORY)}")
    for line in unknown:
        print(f"left as it is (names no folder of the repository): {line}", file=sys.stderr)
    print(f"{len(changed)} file(s) {'hold absolute paths' if args.check else 'rewritten'}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
