"""A reproduction run in pieces, for machines that do not last as long as the run.

reproduction/reproduce_paper.sh runs for a day or more on a 2-core box; where each
working session gets a fresh machine for a few hours and only the repository
carries over, a run can go on only from what is committed, and trees and
weights are never committed. So a run is cut where the state that crosses is
small:

* an iteration's search is split into pieces (``slice``), each a run of its
  own over a few of the train tasks, searched and turned into data
  (iterate.py with STOP_AFTER=data) within one session;
* ``bank`` packs a run's finished small state into a committed archive: the
  done-markers, the data stages' training files, the evals' summaries and
  task files, never trees, per-tree caches or weights; each eval's episode
  files go to an archive of their own under ``episodes/`` (written once,
  the same bytes after), so every transcript and per-episode count the docs
  quote can be checked against a committed file, and an eval cut by its
  machine's end goes on from its banked episodes; ``restore`` unpacks it
  all into a fresh runs/ folder;
* ``merge`` joins the pieces' data into the whole run's iteration: the search
  and data done-markers with their statistics summed, each variant's rows
  joined in piece order and exported again as the data stage exports them.
  A piece's rows equal the whole run's rows for the same trees: the pair
  choice is seeded per tree, and the export's shuffle is redone on the join.

A model the restored run still needs and no longer has (weights are not
banked, the train stage's marker is) is rebuilt from its banked LoRA adapter
in seconds (a run with LORA_RANK), else fine-tuned again from the banked
training file by the next iterate.py; one no stage needs is not. Adapters
are banked as loose files beside the archive (about 10 MB each, which do not
compress, and stay the same bytes from one bank to the next), and a bank
that would take the run's committed folder past its size limit (100 MB)
is refused with one line naming the file. A LoRA fine-tune still training
banks its latest step checkpoint the same way (about 23 MB: the adapter's
change and AdamW's moments in bf16, gzipped), so the next machine goes on
from that step; it leaves
the bank once the adapter is banked. A checkpoint that would break the limit
is left out with a warning and the rest is banked: the episodes and adapters
are results, the checkpoint only saves a fine-tune's progress.

    python -m reproduction.pieces slice --split runs/smollm2/train_tasks.json --part 1 --of 20 --out F
    python -m reproduction.pieces bank --run runs/smollm2 --bank reproduction/smollm2/bank
    python -m reproduction.pieces restore --bank reproduction/smollm2/bank --run runs/smollm2
    python -m reproduction.pieces merge --iteration 1 --into runs/smollm2 --pieces runs/smollm2-piece-01-of-20,... \\
        [iterate.py's flags: the export's settings]
"""
from __future__ import annotations

import argparse
import gzip
import io
import logging
import re
import tarfile
from pathlib import Path
from typing import Any

from agent_r.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json, strict_json
from agent_r.paths import (ADAPTER_DIR, BASE, CHECKPOINT_DIR, EXPORT_FILE, MANIFEST, PARTS, RESULT_PREFIX, SUMMARY,
                           portable_paths)
from agent_r.loop.shards import LOG_FOLDER as SHARD_FILES
from agent_r.training.checkpoint import PROGRESS
from agent_r.settings import UsageError, run_cli, setup_logging

log = logging.getLogger(__name__)

MARKER = ".done.json"   # agent_r/loop/stages.py's done-marker
BANKED_STAGES = ("search", "data", "train", "eval")
MARKER_ONLY = ("search", "train")   # their trees and weights stay behind
ARCHIVE = "state.tar.gz"   # a bank folder's archive (adapters lie beside it)
EPISODES = "episodes"      # under a bank: <eval run folder, relative to the run>.tar.gz, one per eval run
SPLIT_FILE = "train_tasks.json"   # a run's (and a piece's) task list, banked at its root
LIMIT_MB = 100              # the most a run's committed folder may hold


def slice_tasks(split: Path, part: int, of: int) -> list[dict]:
    """Part ``part`` (1-based) of ``of`` near-equal contiguous parts of a task list."""
    tasks = read_json(split)
    if not isinstance(tasks, list) or not tasks:
        raise UsageError(f"{split} is not a task list (a JSON list of {{\"item_id\": ...}}): rebuild it with "
                         "python -m agent_r.loop.search_tasks")
    if not 1 <= part <= of <= len(tasks):
        raise UsageError(f"part {part} of {of}: need 1 <= part <= of <= {len(tasks)} (the tasks in {split})")
    return tasks[(part - 1) * len(tasks) // of: part * len(tasks) // of]


# --------------------------------------------------------------------------- bank and restore

def _stage(marker: Path) -> str | None:
    try:
        done = read_json(marker)
        return done.get("stage") if isinstance(done, dict) else None
    except (ValueError, OSError):
        return None


def banked_files(run: Path) -> list[Path]:
    """The run's small state, relative to ``run``: the run's task lists, and
    under every finished search, data or eval stage its marker and small
    files; never a tree or episode file, a per-tree cache, or a model."""
    out = [p.relative_to(run) for p in run.glob("*.json") if p.is_file()]
    shared = _shared(run)
    for marker in sorted(run.glob(f"iter_*/*/*/{MARKER}")):
        stage, folder = _stage(marker), marker.parent
        if stage not in BANKED_STAGES or marker.relative_to(run).parts[0] in shared:
            continue
        if stage in MARKER_ONLY:   # and a search's manifest (its samples and seconds), never its trees
            out.append(marker.relative_to(run))
            out += [p.relative_to(run) for p in sorted(folder.glob(f"*/*/{MANIFEST}")) if stage == "search"]
            continue
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            # never the shard processes' job files and logs (agent_r/loop/shards.py): machine paths, no results
            if path.is_file() and PARTS not in rel.parts and SHARD_FILES not in rel.parts \
                    and not path.name.startswith(RESULT_PREFIX):
                out.append(path.relative_to(run))
    return out


def adapter_files(run: Path) -> list[Path]:
    """Every finished fine-tune's LoRA adapter files, relative to ``run``."""
    shared = _shared(run)
    return [p.relative_to(run) for marker in sorted(run.glob(f"iter_*/model/*/{MARKER}"))
            if _stage(marker) == "train" and marker.relative_to(run).parts[0] not in shared
            for p in sorted((marker.parent / ADAPTER_DIR).glob("*")) if p.is_file()]


def checkpoint_files(run: Path) -> list[Path]:
    """The step checkpoints of adapters still training (no train marker yet),
    relative to ``run``: a fine-tune longer than its machine goes on from
    them (agent_r/training/checkpoint.py). A full fine-tune's is never banked."""
    out = []
    for progress in sorted(run.glob(f"iter_*/model/*/{CHECKPOINT_DIR}/{PROGRESS}")):
        folder = progress.parent
        if (folder.parent / MARKER).exists() or folder.relative_to(run).parts[0] in _shared(run):
            continue
        try:
            if read_json(progress).get("adapter") is not True:
                continue
        except (OSError, ValueError):
            continue
        out += [p.relative_to(run) for p in sorted(folder.iterdir()) if p.is_file()]
    return out


def episode_runs(run: Path) -> list[Path]:
    """The eval run folders (eval.py's, under any ``iter_<k>/eval*/``) that
    hold episode files, relative to ``run``: finished or not, so a long eval
    goes on from what its last machine banked."""
    shared = _shared(run)
    folders = {p.parent for p in run.glob(f"iter_*/eval*/**/{RESULT_PREFIX}*.json")}
    return sorted(f.relative_to(run) for f in folders if f.relative_to(run).parts[0] not in shared)


def episode_archive(dest: Path, rel: Path) -> Path:
    return dest / EPISODES / f"{rel.as_posix()}.tar.gz"


def _shared(run: Path) -> set[str]:
    """A piece of a later iteration links the whole run's earlier iterations: they are the run's to bank."""
    return {p.name for p in run.glob("iter_*") if p.is_symlink()}


def bank(run: Path, dest: Path, limit_root: Path | None = None, limit_mb: float = LIMIT_MB) -> int:
    """Writes ``banked_files(run)`` into ``dest/state.tar.gz`` (atomically;
    the same state gives the same bytes, so an unchanged bank is no change to
    commit) and the run's adapters as loose files under ``dest``; returns how
    many files. One archive: the training rows repeat their prompts, and
    compress about 30 times. Refuses (UsageError) when the files would take
    ``limit_root`` (the run's committed folder; default ``dest``) past
    ``limit_mb``, before writing anything."""
    if not run.is_dir():
        raise UsageError(f"run folder {run} does not exist")
    files, checkpoints = banked_files(run), checkpoint_files(run)
    episodes = {episode_archive(dest, rel): packed([(p.name, committed(p)) for p in eval_files(run / rel)])
                for rel in episode_runs(run)}

    def fits(loose: list[Path], training: set[Path]) -> list[Path]:
        """The banked checkpoint files to drop (their fine-tune finished or
        started over); raises UsageError when the bank would not fit."""
        stale = [p for p in dest.glob(f"iter_*/model/*/{CHECKPOINT_DIR}/*")
                 if p.relative_to(dest) not in loose and p.parent.relative_to(dest) not in training]
        check_size(dest, limit_root or dest, limit_mb, [(p, 0) for p in stale] +
                   [(dest / rel, (run / rel).stat().st_size) for rel in loose] +
                   [(path, len(data)) for path, data in episodes.items()])
        return stale

    loose = adapter_files(run) + checkpoints
    try:
        stale = fits(loose, set())
    except UsageError as err:
        if not checkpoints:
            raise
        # A step checkpoint only saves a fine-tune's progress; the episodes and
        # adapters beside it are the run's results, and must not wait for it.
        # Of several fine-tunes' checkpoints (two lanes), those that fit are banked.
        loose = adapter_files(run)
        fine_tunes: dict[Path, list[Path]] = {}
        for rel in checkpoints:
            fine_tunes.setdefault(rel.parent, []).append(rel)
        left_out = set(fine_tunes)
        for folder, members in sorted(fine_tunes.items()):
            try:
                fits(loose + members, left_out - {folder})
            except UsageError:
                continue
            loose, left_out = loose + members, left_out - {folder}
        stale = fits(loose, left_out)
        log.warning("%s; banked the rest without the step checkpoint of %s (a fresh machine starts that "
                    "fine-tune over; the one it had banked before, if any, stays)", err,
                    ", ".join(str(f.parent) for f in sorted(left_out)))
    for path, data in episodes.items():
        if not path.exists() or path.read_bytes() != data:
            atomic_write_bytes(path, data)
    for rel in loose:
        if not (dest / rel).exists() or (dest / rel).read_bytes() != (run / rel).read_bytes():
            atomic_write_bytes(dest / rel, (run / rel).read_bytes())
    for path in stale:   # its fine-tune finished (its adapter is banked) or started over
        path.unlink()
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    pack([(rel.as_posix(), committed(run / rel)) for rel in files], dest)
    return len(files) + len(loose) + len(episodes)


def eval_files(folder: Path) -> list[Path]:
    """An eval folder's episodes, with the manifests and summary that say
    which machines played them: an eval resumed on a fresh machine names
    the earlier ones too (agent_r.provenance.of_summary)."""
    return sorted([*folder.glob(f"{RESULT_PREFIX}*.json"), *folder.glob("manifest*.json"),
                   *[p for p in [folder / SUMMARY] if p.is_file()]])


def committed(path: Path) -> bytes:
    """A banked file's bytes; a manifest's absolute paths (written before
    manifests recorded portable ones) made relative, as committed files name
    models and data."""
    if not (path.name.startswith("manifest") and path.suffix == ".json"):
        return path.read_bytes()
    try:
        return (strict_json(portable_paths(read_json(path)), indent=2) + "\n").encode("utf-8")
    except ValueError:   # unreadable: banked as it is, and a resumed run writes a new one
        return path.read_bytes()


def check_size(dest: Path, root: Path, limit_mb: float, incoming: list[tuple[Path, int]]) -> None:
    """One line naming the first file that would take ``root`` past the limit."""
    have = {p.resolve(): p.stat().st_size for p in root.rglob("*") if p.is_file()} if root.exists() else {}
    total = sum(have.values())
    for path, size in incoming:
        total += size - have.get(path.resolve(), 0)
        if total > limit_mb * (1 << 20):
            raise UsageError(f"banking {path} ({size / (1 << 20):.1f} MB) would take {root} to "
                             f"{total / (1 << 20):.0f} MB, past its {limit_mb:g} MB limit: commit the run's models "
                             "elsewhere, or raise --limit_mb")


def packed(members: list[tuple[str, bytes]]) -> bytes:
    """A tar.gz of ``members`` (name, bytes) in name order, with no times or
    owners: the same members give the same bytes."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def pack(members: list[tuple[str, bytes]], dest: Path) -> None:
    """``dest/state.tar.gz`` holding ``members``, written atomically."""
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dest / ARCHIVE, packed(members))


def unpack(archive: Path, into: Path) -> int:
    """An archive's files into ``into``, never over a file already there; how many."""
    copied = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                rel = Path(member.name)
                if not member.isfile() or rel.is_absolute() or ".." in rel.parts:
                    raise tarfile.TarError(f"unexpected member {member.name!r}")
                target = into / rel
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                copied += 1
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"bank {archive} is unreadable ({exc}): restore it from git (git checkout -- {archive}) "
                         "or delete it to start that run over") from None
    return copied


def restore(src: Path, run: Path) -> int:
    """Unpacks a bank into a run folder (the archive, the evals' episode
    archives, then the loose adapter and step checkpoint files), never over
    a file the run already has; returns how many."""
    archive = src / ARCHIVE
    if not archive.exists():   # a run's first session: nothing banked yet
        log.info("no bank at %s yet: nothing to restore", archive)
        return 0
    copied = unpack(archive, run)
    for path in sorted((src / EPISODES).rglob("*.tar.gz")):
        rel = path.relative_to(src / EPISODES).as_posix()[:-len(".tar.gz")]
        copied += unpack(path, run / rel)
    for path in sorted(src.glob(f"iter_*/model/*/{ADAPTER_DIR}/*")):
        target = run / path.relative_to(src)
        if path.is_file() and not target.exists():
            atomic_write_bytes(target, path.read_bytes())
            copied += 1
    for folder in sorted(src.glob(f"iter_*/model/*/{CHECKPOINT_DIR}")):
        target = run / folder.relative_to(src)
        if target.exists() or (target.parent / MARKER).exists():   # the run's own is newer, or done
            continue
        for path in sorted(folder.iterdir()):
            atomic_write_bytes(target / path.name, path.read_bytes())
            copied += 1
    return copied


# --------------------------------------------------------------------------- merge

def summed(values: list[Any]) -> Any:
    """Statistics of pieces joined: numbers added, dicts merged key by key;
    ``mean_first_bad_step`` is recomputed from the summed histogram by the caller."""
    values = [v for v in values if v is not None]   # e.g. a mean over nothing
    first = values[0] if values else None
    if isinstance(first, bool) or not isinstance(first, (int, float, dict)):
        return first
    if isinstance(first, dict):
        out: dict = {}
        for key in dict.fromkeys(k for v in values for k in v):
            out[key] = summed([v[key] for v in values if key in v])
        return out
    return sum(values)


def _mean_first_bad(hist: dict) -> float | None:
    found = {int(pos): n for pos, n in hist.items() if pos != "none"}
    return round(sum(p * n for p, n in found.items()) / sum(found.values()), 3) if found else None


def merge_stats(stats: list[dict]) -> dict:
    out = summed(stats)
    for task_stats in out.get("tasks", {}).values():
        if "first_bad" in task_stats:
            task_stats["mean_first_bad_step"] = _mean_first_bad(task_stats["first_bad"])
    return out


def _markers(pieces: list[Path], rel: Path, stage: str) -> list[dict]:
    found = []
    for piece in pieces:
        marker = piece / rel / MARKER
        if _stage(marker) != stage:
            raise UsageError(f"{piece}: its {stage} stage of {rel} is not finished ({marker} missing): run that "
                             "piece to the end first (reproduction/reproduce_paper.sh with PIECE)")
        found.append(read_json(marker))
    return found


def _of_variants(folders: set[Path], variants: list[str] | None) -> list[Path]:
    """The stage folders (trees/<label>, data/<variant>) that ``variants`` read;
    iteration 1's shared search (trees/base) is read by every variant."""
    return sorted(f for f in folders if variants is None or f.name in variants or f.name == BASE)


def merge(pieces: list[Path], into: Path, iteration: int, export_data: Any,
          variants: list[str] | None = None, marks: Any = None) -> dict:
    """Joins the pieces' iteration ``iteration`` into run ``into``: every
    search marker (summed), every data folder (rows joined in piece order,
    then ``export_data(variant, jsonl_files, export_file)`` -> train_samples).
    ``variants`` limits it to theirs, so one variant's pieces can be merged
    while another variant's pieces of the same iteration are still running.
    ``marks`` join every data marker's statistics (the export's own settings,
    e.g. ``mask_refused`` or ``clean_paths`` with its report, and where the
    rows came from): a dict, or a function of the variant. A "piece" may be a
    whole other run: a run that trains on another run's rows (DATA_FROM)
    merges that one run, and its markers name it (``data_from``).
    Returns {stage folder: stats}."""
    if not pieces:
        raise UsageError("merge needs at least one piece run folder")
    it = Path(f"iter_{iteration}")
    written = {}
    searches = _of_variants({p.parent.relative_to(pieces[0]) for p in (pieces[0] / it / "trees").glob(f"*/{MARKER}")},
                            variants)
    datas = _of_variants({p.parent.relative_to(pieces[0]) for p in (pieces[0] / it / "data").glob(f"*/{MARKER}")},
                         variants)
    if not datas:
        which = f" of {','.join(variants)}" if variants else ""
        raise UsageError(f"{pieces[0]} has no finished data stage{which} in {it}: nothing to merge")
    for rel in searches:
        done = _markers(pieces, rel, "search")
        stats = merge_stats([d["stats"] for d in done])
        atomic_write_json(into / rel / MARKER, {"stage": "search", "stats": stats,
                                                "seconds": round(sum(d["seconds"] for d in done), 1)})
        written[str(rel)] = stats
    for rel in datas:
        done = _markers(pieces, rel, "data")
        folder = into / rel
        folder.mkdir(parents=True, exist_ok=True)
        names = sorted({p.name for piece in pieces for p in (piece / rel).glob("*.jsonl")})
        for name in names:
            text = "".join(_text(piece / rel / name) for piece in pieces)
            atomic_write_text(folder / name, text)
        variant = rel.name
        exported = folder / EXPORT_FILE
        if names:
            train_samples = export_data(variant, [str(folder / n) for n in names], exported)
        else:   # eto: its export is the pairs list itself
            pairs = [q for piece in pieces if (piece / rel / EXPORT_FILE).exists()
                     for q in read_json(piece / rel / EXPORT_FILE)]
            if pairs:
                atomic_write_json(exported, pairs, indent=None)
            train_samples = len(pairs)
        stats = merge_stats([d["stats"] for d in done])
        stats["train_samples"] = train_samples
        stats["pieces"] = len(pieces)
        stats.update(marks(variant) if callable(marks) else marks or {})
        atomic_write_json(folder / MARKER, {"stage": "data", "stats": stats,
                                            "seconds": round(sum(d["seconds"] for d in done), 1)})
        written[str(rel)] = stats
    return written


def loop_merge(pieces: list[Path], into: Path, iteration: int, iterate_argv: list[str],
               data_from: str | None = None) -> dict:
    """``merge`` with iterate.py's settings (flags after merge's own, and the
    environment): the variants of VARIANTS that run this iteration, their rows
    exported as the whole run's data stage would have exported them."""
    from agent_r.loop import IterateSettings
    from agent_r.loop.stages import export_rows, recipe_marks
    from agent_r.settings import parse

    s = parse(IterateSettings, iterate_argv, prog="python -m reproduction.pieces merge")
    s.finish()
    marks: dict[str, dict] = {}

    def export_data(variant: str, files: list[str], out: Path) -> int:
        samples = export_rows(s, files, out, s.backend.model_dir)
        marks[variant] = recipe_marks(s, out)
        return samples

    return merge(pieces, into, iteration, export_data, s.variants_at(iteration),
                 lambda variant: {**marks.get(variant, {}), **({"data_from": data_from} if data_from else {})})


def _text(path: Path) -> str:
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    return text if not text or text.endswith("\n") else text + "\n"


# --------------------------------------------------------------------------- status

def _archived_json(archive: Path) -> dict[str, Any]:
    import json

    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")}


def piece_name(name: str, iteration: int, j: int, of: int) -> str:
    """A piece's run folder and bank folder: part ``j`` of ``of`` of iteration ``iteration``'s train tasks."""
    return f"{name}-i{iteration}-piece-{j:02d}-of-{of:02d}"


def _span(j: int, of: int, n: int) -> tuple[int, int]:
    """The task indices part ``j`` of ``of`` holds of ``n`` (slice_tasks's cut)."""
    return (j - 1) * n // of, j * n // of


def _finished(files: dict[str, Any], iteration: int, variant: str | None) -> bool:
    """Whether a piece's archived markers hold ``variant``'s search and data (any variant's, with None)."""
    def marked(stage: str) -> bool:
        return any(k.startswith(f"iter_{iteration}/{stage}/") and k.endswith(MARKER)
                   and (variant is None or k.split("/")[2] in (variant, BASE)) for k in files)
    return marked("trees") and marked("data")


def _banked(bank_dir: Path, name: str, iteration: int) -> dict[str, tuple[int, int, dict[str, Any]]]:
    """Every banked piece of the iteration, whatever PIECES cut it: {folder: (j, of, its archived JSON)}."""
    found = {}
    for folder in sorted((bank_dir / "pieces").glob(f"{name}-i{iteration}-piece-*-of-*")):
        cut = re.fullmatch(rf"{re.escape(name)}-i{iteration}-piece-(\d+)-of-(\d+)", folder.name)
        if cut and (folder / ARCHIVE).exists():
            found[folder.name] = (int(cut[1]), int(cut[2]), _archived_json(folder / ARCHIVE))
    return found


def _spans(banked: dict[str, tuple[int, int, dict]], bank_dir: Path, iteration: int,
           variants: list[str | None]) -> tuple[int, dict[str, tuple[int, int]]] | None:
    """(the run's task count, {piece: its task span}) of the banked pieces finished
    for every one of ``variants``, whatever their PIECES; None where the bank
    lacks the run's task list. A piece whose own task list is not its span of
    the run's (the list changed since) is left out: it is run again."""
    archive = bank_dir / ARCHIVE
    tasks = _archived_json(archive).get(SPLIT_FILE) if archive.exists() else None
    if not isinstance(tasks, list) or not tasks:
        return None
    ids = [t.get("item_id") for t in tasks]
    spans = {}
    for piece, (j, of, files) in banked.items():
        if of > len(ids) or not all(_finished(files, iteration, v) for v in variants):
            continue
        lo, hi = _span(j, of, len(ids))
        own = files.get(SPLIT_FILE)
        if own is None or [t.get("item_id") for t in own] == ids[lo:hi]:
            spans[piece] = (lo, hi)
        else:
            log.warning("%s: its tasks are not part %d of %d of the run's task list; left out", piece, j, of)
    return len(ids), spans


def _plan(bank_dir: Path, name: str, iteration: int, of: int,
          variants: list[str | None]) -> list[tuple[str, bool]]:
    """The pieces, in task order, that hold iteration ``iteration``'s search and
    data for ``variants``: (piece, whether it is still to run). The banked
    pieces count whatever PIECES cut them, so a run that changed PIECES
    mid-iteration keeps what it finished; what they leave is run as parts of
    ``of``: the fewest such parts, then the fewest pieces."""
    banked = _banked(bank_dir, name, iteration)
    known = _spans(banked, bank_dir, iteration, variants)
    finished = {piece_name(name, iteration, j, of) for j in range(1, of + 1)} & {
        piece for piece, (_, _, files) in banked.items() if all(_finished(files, iteration, v) for v in variants)}
    if known is None or of > known[0]:   # no task list to line other cuts up with: the parts of ``of`` alone
        return [(piece_name(name, iteration, j, of), piece_name(name, iteration, j, of) not in finished)
                for j in range(1, of + 1)]
    n, spans = known
    edges = [(lo, hi, piece, False) for piece, (lo, hi) in spans.items()]
    edges += [(*_span(j, of, n), piece_name(name, iteration, j, of), True) for j in range(1, of + 1)
              if piece_name(name, iteration, j, of) not in spans]
    best: dict[int, tuple[tuple[int, int], list[tuple[str, bool]]]] = {0: ((0, 0), [])}
    for pos in range(n):   # every piece ends after it starts, so ``pos`` is settled when reached
        if pos not in best:
            continue
        (runs, count), path = best[pos]
        for lo, hi, piece, to_run in sorted(edges):
            cost = (runs + to_run, count + 1)
            if lo == pos and (hi not in best or cost < best[hi][0]):
                best[hi] = (cost, path + [(piece, to_run)])
    return best[n][1]


def cover(bank_dir: Path, name: str, iteration: int, of: int, variants: list[str]) -> list[str]:
    """The banked pieces, in task order, that MERGE=``of`` joins for ``variants``."""
    plan = _plan(bank_dir, name, iteration, of, list(variants) or [None])
    missing = [piece for piece, to_run in plan if to_run]
    if missing:
        raise UsageError(f"{', '.join(missing)} of iteration {iteration} ({','.join(variants) or 'any variant'}) "
                         f"not in {bank_dir}: run them first (PIECE=j/{of}), or merge each variant with "
                         "VARIANTS of its own")
    return [piece for piece, _ in plan]


def status(bank_dir: Path, name: str, iteration: int, of: int,
           variant: str | None = None) -> tuple[list[list[str]], list[int]]:
    """(a row per banked piece of iteration ``iteration``, the parts of ``of``
    still to run); with ``variant``, that variant's search and data only: from
    iteration 2 on each variant searches with its own model, piece by piece.
    Banked pieces of another PIECES hold their tasks; their rows are labelled j/PIECES."""
    rows, todo = [], []
    banked = _banked(bank_dir, name, iteration)
    for piece, to_run in _plan(bank_dir, name, iteration, of, [variant]):
        j, pof = int(piece.split("-")[-3]), int(piece.split("-")[-1])
        if to_run:
            todo.append(j)
        else:
            rows.append([str(j) if pof == of else f"{j}/{pof}", *_counts(banked[piece][2], iteration, variant)])
    return rows, todo


def _counts(files: dict[str, Any], iteration: int, variant: str | None) -> list[str]:
    """A finished piece's row: trees, with a success, agent-r revision samples, train samples,
    search minutes, search samples a second."""
    def wanted(k: str) -> bool:
        return variant is None or k.split("/")[2] in (variant, BASE)
    data = {k.split("/")[2]: v["stats"] for k, v in files.items()
            if k.startswith(f"iter_{iteration}/data/") and k.endswith(MARKER) and wanted(k)}
    searches = {k: v for k, v in files.items()
                if k.startswith(f"iter_{iteration}/trees/") and k.endswith(MARKER) and wanted(k)}
    trees = summed([next(iter(v["stats"].values())) for v in searches.values()])
    seconds = sum(v["seconds"] for v in searches.values())
    samples = sum(v["stats"]["backend"]["samples"] for k, v in files.items()
                  if k.startswith(f"iter_{iteration}/trees/") and k.endswith(MANIFEST) and wanted(k))
    revision = sum(next(iter(d["tasks"].values())).get("revision_samples", 0) for v, d in data.items()
                   if v == "agent-r")
    return [str(trees["trees"]), str(trees["trees_with_success"]), str(revision),
            str(sum(d["train_samples"] for d in data.values())), f"{seconds / 60:.0f}",
            f"{samples / seconds:.2f}" if samples and seconds else "-"]


# --------------------------------------------------------------------------- cli

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reproduction.pieces", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cut = sub.add_parser("slice", help="write part PART of OF of a task list")
    cut.add_argument("--split", required=True)
    cut.add_argument("--part", type=int, required=True)
    cut.add_argument("--of", type=int, required=True)
    cut.add_argument("--out", required=True)
    b = sub.add_parser("bank", help="copy a run's small finished state into a bank folder")
    b.add_argument("--run", required=True)
    b.add_argument("--bank", required=True)
    b.add_argument("--limit_root", help="the run's committed folder whose size is limited (default: --bank)")
    b.add_argument("--limit_mb", type=float, default=LIMIT_MB, help=f"its limit (default {LIMIT_MB})")
    r = sub.add_parser("restore", help="copy a bank folder into a run folder (never over a file)")
    r.add_argument("--bank", required=True)
    r.add_argument("--run", required=True)
    m = sub.add_parser("merge", help="join the pieces' search and data stages into the whole run")
    m.add_argument("--iteration", type=int, required=True)
    m.add_argument("--into", required=True)
    m.add_argument("--pieces", required=True, help="the piece run folders, comma-separated, in task order")
    m.add_argument("--data_from", help="the pieces are one other run whose rows this run trains on (DATA_FROM): "
                   "the name the data markers record")
    st = sub.add_parser("status", help="which pieces of an iteration are banked, and what they hold")
    st.add_argument("--bank", required=True)
    st.add_argument("--name", required=True, help="the whole run's name (NAME)")
    st.add_argument("--iteration", type=int, required=True)
    st.add_argument("--of", type=int, required=True)
    st.add_argument("--variant", help="that variant's search and data only (default: every variant's, summed)")
    cv = sub.add_parser("cover", help="the banked pieces that MERGE=OF joins, comma-separated, in task order")
    cv.add_argument("--bank", required=True)
    cv.add_argument("--name", required=True, help="the whole run's name (NAME)")
    cv.add_argument("--iteration", type=int, required=True)
    cv.add_argument("--of", type=int, required=True)
    cv.add_argument("--variants", default="", help="the variants merged (default: any)")
    args, rest = parser.parse_known_args(argv)
    setup_logging()
    if args.command == "slice":
        tasks = slice_tasks(Path(args.split), args.part, args.of)
        atomic_write_json(Path(args.out), tasks)
        print(f"part {args.part} of {args.of}: {len(tasks)} tasks -> {args.out}")
    elif args.command == "bank":
        count = bank(Path(args.run), Path(args.bank), Path(args.limit_root) if args.limit_root else None,
                     args.limit_mb)
        print(f"banked {count} files of {args.run} in {args.bank}")
    elif args.command == "status":
        rows, todo = status(Path(args.bank), args.name, args.iteration, args.of, args.variant)
        head = ["piece", "trees", "with a success", "agent-r revision samples", "train samples (all variants)",
                "search min", "search samples/s"]
        for row in [head, ["---"] * len(head), *rows]:
            print("| " + " | ".join(row) + " |")
        print(f"{len(rows)} pieces banked; parts of {args.of} to run: {' '.join(map(str, todo)) or 'none'}")
    elif args.command == "cover":
        print(",".join(cover(Path(args.bank), args.name, args.iteration, args.of,
                             [v for v in args.variants.split(",") if v])))
    elif args.command == "restore":
        print(f"restored {restore(Path(args.bank), Path(args.run))} files of {args.bank} into {args.run}")
    else:
        written = loop_merge([Path(p) for p in args.pieces.split(",") if p], Path(args.into), args.iteration, rest,
                             args.data_from)
        for folder, stats in written.items():
            print(f"{folder}: {stats.get('train_samples', stats)}")
    return 0


if __name__ == "__main__":
    run_cli(main)
