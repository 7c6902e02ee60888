"""Summaries and manifests rebuilt from banked episode files, for evals whose
own summary never reached the repository (reruns, the `ok` reply, fp32).

Every count comes from the episode files through the project's own summary
code (agent_r.report.summarize_dir); the provenance names the weights by the
sha256 the model's adapter record names (the model an eval folder of
``iter_<k>/eval*/<variant>/`` loaded is model_k of that variant; iteration
0's is the base, named by the run's committed base summary), the dtype only
where the folder's EVAL_TAG says it (``fp32``), and writes ``unknown`` for
every field nothing recorded (machine, commit, backend): never a guess.

    python -m scripts.rebuild_summaries --run runs/smollm2 --committed reproduction/smollm2 \\
        --out reproduction/smollm2/summaries
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Optional

from agent_r.envs import get_env
from agent_r.provenance import UNKNOWN
from agent_r.io import atomic_write_json, read_json
from agent_r.paths import RESULT_PREFIX
from agent_r.report import summarize_dir
from agent_r.settings import UsageError, run_cli, setup_logging
from agent_r.training.adapter import ADAPTER_RECORD, CHECKSUM

EVAL_FOLDER = re.compile(r"iter_(?P<k>\d+)/eval(?:_(?P<tag>[A-Za-z0-9-]+?))?(?:_wait_(?P<reply>ok))?/(?P<variant>[^/]+)/")


def eval_folders(run: Path) -> list[Path]:
    """Every eval run folder of the run that holds episode files."""
    return sorted({p.parent for p in run.glob(f"iter_*/eval*/**/{RESULT_PREFIX}*.json")})


def model_sha256(run: Path, committed: Path, k: int, variant: str) -> Optional[str]:
    """The weights an eval of model_k of ``variant`` loaded: its adapter
    record's sha256, or for the base its committed base eval's."""
    if k == 0:
        for summary in sorted(committed.glob("iter_0/eval/base/textcraft/*/summary.json")):
            sha = read_json(summary).get("model_sha256")
            if sha:
                return sha
        return None
    record = run / f"iter_{k}" / "model" / variant / "adapter" / ADAPTER_RECORD
    try:
        return read_json(record)[CHECKSUM]
    except (OSError, ValueError, KeyError):
        return None


def rebuild(run_dir: Path, run: Path, committed: Path) -> dict[str, Any]:
    """The summary of one eval folder, from its episode files."""
    rel = run_dir.relative_to(run).as_posix()
    found = EVAL_FOLDER.match(rel + "/")
    if found is None:
        raise UsageError(f"{run_dir} is not an eval folder of the loop (iter_<k>/eval*/<variant>/...)")
    k, tag, reply, variant = int(found["k"]), found["tag"] or "", found["reply"] or "env", found["variant"]
    spec = get_env("textcraft")
    summary = summarize_dir(run_dir, spec)
    summary["run_dir"] = rel
    summary["mode"] = "revise" if "_revise" in run_dir.name else "test"
    summary["wait_reply"] = reply
    sha = model_sha256(run, committed, k, variant)
    summary["model_sha256"] = sha or UNKNOWN
    samples = re.search(r"_samples(\d+)", run_dir.name)
    summary["provenance"] = {
        "model_sha256": sha or UNKNOWN, "backend": UNKNOWN, "dtype": "float32" if tag.startswith("fp32") else UNKNOWN,
        "machines": [UNKNOWN], "commits": [UNKNOWN],
        "settings": {"temperature": UNKNOWN, "samples": int(samples[1]) if samples else 1, "max_steps": UNKNOWN,
                     "wait_reply": reply, "max_new_tokens": UNKNOWN, "max_token_length": UNKNOWN},
        "rebuilt": "from the banked episode files by scripts/rebuild_summaries.py; the dtype from the folder's "
                   "EVAL_TAG where it names one, the weights from the model's adapter record"}
    return summary


def call_machines(calls: Path, rel: Path) -> list[str]:
    """The machines the bank's calls.jsonl names for the call(s) that ran the
    run's own evals of ``rel`` (``iter_<k>/eval/<variant>/...``: the calls of
    reproduction/one_call.py that fine-tuned and evaluated iteration k of
    that variant); [] where no call names one (before calls were recorded)."""
    import json

    found = EVAL_FOLDER.match(rel.as_posix() + "/")
    if found is None or found["tag"] or found["reply"] or not calls.exists():
        return []
    stage = f"merge, fine-tunes and evals of iteration {found['k']}"
    rows = [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]
    return sorted({r["machine"] for r in rows if r.get("stage") == stage and found["variant"] in r.get("variants", [])})


def backfill(path: Path, episodes: Optional[Path], machines: Optional[list[str]] = None) -> bool:
    """A committed summary written before summaries held a provenance: the
    provenance from what it does record (weights, backend, dtype, settings;
    ``unknown`` for the rest), and the revision-turn kinds and refused
    actions recounted from its episodes where they are banked. False when
    it already has one."""
    summary = read_json(path)
    if "provenance" in summary:
        return False
    backend, config = summary.get("backend") or {}, summary.get("config") or {}
    summary["provenance"] = {
        "model_sha256": summary.get("model_sha256") or UNKNOWN, "backend": backend.get("backend") or UNKNOWN,
        "dtype": backend.get("dtype") or UNKNOWN, "machines": machines or [UNKNOWN], "commits": [UNKNOWN],
        "settings": {"temperature": config.get("temperature", UNKNOWN), "samples": config.get("eval_samples", 1),
                     "max_steps": config.get("max_steps", UNKNOWN),
                     "wait_reply": summary.get("wait_reply") or config.get("wait_reply", UNKNOWN),
                     "max_new_tokens": config.get("max_new_tokens", UNKNOWN),
                     "max_token_length": config.get("max_token_length", UNKNOWN)},
        "rebuilt": "added to a summary written before summaries recorded provenance (scripts/rebuild_summaries.py): "
                   "from the fields it recorded" + (", the machine from the bank's calls.jsonl" if machines else "")
                   + ", unknown for the rest"}
    if episodes is not None and any(episodes.glob(f"{RESULT_PREFIX}*.json")):
        again = summarize_dir(episodes, get_env(summary.get("task") or "textcraft"))
        summary["revision_turns"], summary["refused_actions"] = again["revision_turns"], again["refused_actions"]
    atomic_write_json(path, summary)
    return True


def backfill_results(path: Path, committed: Path) -> int:
    """results.json rows written before rows recorded a provenance: each
    eval's from its committed summary, and the row's weights from it."""
    results = read_json(path)
    changed = 0
    for row in results["rows"]:
        k, variant = row["iteration"], row["variant"]
        name = "base" if variant == "base" else f"{variant}-iter{k}"
        for part, suffix in (("test", "_test"), ("revise_task", "_test_revise")):
            for task, stats in (row.get(part) or {}).items():
                summary = committed / f"iter_{k}" / "eval" / variant / task / f"{name}{suffix}" / "summary.json"
                if isinstance(stats, dict) and "provenance" not in stats and summary.exists():
                    stats["provenance"] = read_json(summary)["provenance"]
                    changed += 1
        if not row.get("model_sha256"):
            known = {s["provenance"]["model_sha256"] for part in ("test", "revise_task")
                     for s in (row.get(part) or {}).values() if isinstance(s, dict) and "provenance" in s} - {UNKNOWN}
            row["model_sha256"] = known.pop() if len(known) == 1 else UNKNOWN
    atomic_write_json(path, results)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.rebuild_summaries", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="the restored run folder (runs/smollm2)")
    parser.add_argument("--committed", required=True, help="the run's committed results (reproduction/smollm2)")
    parser.add_argument("--out", required=True, help="where the rebuilt summaries go, by the eval's folder path")
    args = parser.parse_args(argv)
    setup_logging()
    run, committed, out = Path(args.run), Path(args.committed), Path(args.out)
    sampled = {str(read_json(p).get("run_dir")) for p in committed.glob("passk/*.json")}
    written = 0
    for run_dir in eval_folders(run):
        rel = run_dir.relative_to(run)
        if (committed / rel / "summary.json").exists() or str(run / rel) in sampled:
            continue   # the run committed this eval's own summary (greedy here, sampled in passk/)
        summary = rebuild(run_dir, run, committed)
        atomic_write_json(out / rel / "summary.json", summary)
        manifest = {"items": {p.stem[len(RESULT_PREFIX):]: {k: read_json(p).get(k) for k in
                                                           ("env_score", "step_num", "ended_by")}
                              for p in sorted(run_dir.glob(f"{RESULT_PREFIX}*.json"))},
                    "model": {"name": None, "path": None, "sha256": summary["model_sha256"]},
                    "rebuilt": summary["provenance"]["rebuilt"]}
        atomic_write_json(out / rel / "manifest.json", manifest)
        written += 1
        print(f"{rel}: {summary.get('episodes', summary['tasks'])} episodes, success "
              f"{100 * summary['success_rate']:.1f}%, model {summary['model_sha256'][:12]}")
    print(f"{written} summaries rebuilt into {out}")
    added = 0
    for path in sorted(committed.glob("iter_*/**/summary.json")):
        rel = path.parent.relative_to(committed)
        added += backfill(path, run / rel, call_machines(committed / "bank" / "calls.jsonl", rel))
    for path in sorted(committed.glob("passk/*.json")):
        added += backfill(path, Path(str(read_json(path).get("run_dir"))))
    print(f"{added} committed summaries given a provenance")
    if (committed / "results.json").exists():
        print(f"{backfill_results(committed / 'results.json', committed)} results rows given a provenance")
    return 0


if __name__ == "__main__":
    run_cli(main)
