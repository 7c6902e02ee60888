"""Two recipes' models side by side, pair by pair, in one results table.

A recipe compared with the paper's on the same data (``make
reproduce-smollm2-masked`` against the SmolLM2 run) is judged by pairs: the
same model of each recipe, the same eval, on the same kind of machine. Each
pair has its own ``eval.py --compare``; this gathers them into the run's
results.json / results.md / results.png so the account quotes one table
whose every cell a reader can recompute from the banked episodes:

    python -m reproduction.pieces restore --bank reproduction/smollm2/bank --run runs/smollm2
    python -m reproduction.pieces restore --bank reproduction/smollm2-masked/bank --run runs/smollm2-masked
    python -m reproduction.pair_table --pairs reproduction/smollm2-masked/pairs.json

The pairs file lists, per row, the model, the eval and the two eval folders
(``reference``: the paper's recipe, or what ``--labels`` names first;
``other``: the recipe measured), and may
carry a ``note`` (where a half predates recorded provenance, say where it
ran). A pair whose halves are not both finished (no summary.json yet) is
listed as pending, not guessed at. Greedy evals pair episode by episode
(gained / lost, McNemar's exact p); sampled ones by task (the paired
bootstrap of Pass@1 and Pass@4). Beside the success figures each row gives
what the masked recipe aims at and what it risks: refusals per episode,
episodes that revise ten times or more, failed episodes that end repeating
one action the environment keeps accepting, and how often an episode that
writes the revision sentence then succeeds (Wilson interval).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent_r import passk, paths, plots, provenance, report
from agent_r.io import atomic_write_json, atomic_write_text, read_json
from agent_r.settings import UsageError, run_cli
from agent_r.significance import paired, wilson_interval


STUCK_REPEATS = 5   # a failed episode whose last 5+ actions repeat one accepted action ended in that loop


def summary_file(run_dir: str) -> Path | None:
    """Where a finished eval's summary lies: in its folder, or (an eval run
    outside the loop, whose summary the bank does not carry) in its committed
    copy, ``runs/<run>/<eval>`` -> ``reproduction/<run>/<eval>`` or
    ``reproduction/<run>/summaries/<eval>``, or among the run's sampled
    summaries in ``reproduction/<run>/passk/``, the one whose ``run_dir`` is
    this eval. None while the eval is not finished: a summary is written at
    an eval's end."""
    folder = Path(run_dir)
    if len(folder.parts) <= 2 or folder.parts[0] != "runs":
        return paths.summary_file(folder) if paths.summary_file(folder).is_file() else None
    name, rest = folder.parts[1], Path(*folder.parts[2:])
    for candidate in (folder, Path("reproduction") / name / rest, Path("reproduction") / name / "summaries" / rest):
        if paths.summary_file(candidate).is_file():
            return paths.summary_file(candidate)
    for kept in sorted((Path("reproduction") / name / "passk").glob("*_summary.json")):
        summary = read_json(kept)
        if isinstance(summary, dict) and summary.get("run_dir") == folder.as_posix():
            return kept
    return None


def _finished(run_dir: str) -> bool:
    return summary_file(run_dir) is not None and bool(paths.result_files(run_dir))


def _half(run_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One eval's own figures, counted from its episode files, and its whole summary."""
    spec = report.env_of_run(run_dir)
    summary = report.summarize_dir(run_dir, spec)
    stuck = sum(1 for r in report.load_results(run_dir)
                if not r.get("success") and report.accepted_repeat_tail(r, spec) >= STUCK_REPEATS)
    revisions = summary["revision_turns"]
    sentence = revisions["sentence"]
    interval = wilson_interval(sentence["succeeded"], sentence["episodes"])
    record = provenance.recorded(summary_file(run_dir))
    half = {"dir": run_dir, "episodes": summary.get("episodes", summary["tasks"]),
            "success_pct": round(100 * summary["success_rate"], 2),
            "refused_per_episode": summary["refused_actions"]["mean"],
            "ten_or_more_revisions": revisions["ten_or_more"], "failed_ending_in_accepted_repeats": stuck,
            "sentence_episodes": sentence["episodes"], "sentence_succeeded": sentence["succeeded"],
            "sentence_wilson_pct": [round(100 * x, 1) for x in interval] if interval else None,
            "provenance": record}
    if "per_task" in summary:
        half["pass_at_k"] = {k: summary["pass_at_k"][k] for k in ("1", "4") if k in summary["pass_at_k"]}
    return half, summary


def measure(pair: dict[str, str]) -> dict[str, Any]:
    """A row of the table: both halves and their pairing, or why it is pending."""
    row = {k: pair[k] for k in ("model", "eval", "reference", "other")}
    if pair.get("note"):
        row["note"] = pair["note"]
    missing = [role for role in ("reference", "other") if not _finished(pair[role])]
    if missing:
        row["pending"] = " and ".join(missing) + " not finished"
        return row
    (ref, ref_summary), (other, other_summary) = _half(pair["reference"]), _half(pair["other"])
    row["reference_figures"], row["other_figures"] = ref, other
    if "per_task" in ref_summary and "per_task" in other_summary:
        row["paired"] = {f"pass_at_{k}": passk.paired_difference(ref_summary["per_task"], other_summary["per_task"], k)
                         for k in (1, 4)}
    elif "per_task" in ref_summary or "per_task" in other_summary:
        raise UsageError(f"{pair['model']}, {pair['eval']}: one half is sampled and the other greedy; "
                         "pair evals of the same kind")
    else:
        spec = report.env_of_run(pair["reference"])
        row["paired"] = paired(report.outcomes(pair["reference"], spec), report.outcomes(pair["other"], spec))
    halves = [pair[r] for r in ("reference", "other")]
    row["provenance_warnings"] = provenance.warnings([str(summary_file(h)) for h in halves],
                                                     report.path_labels(halves), same_model_weights=False)
    return row


def _pct(entry: dict[str, Any] | None, signed: bool = False) -> str:
    return passk.percent_cell(entry, signed=signed)


def _success_cell(half: dict[str, Any]) -> str:
    if "pass_at_k" in half:
        return f"Pass@1 {_pct(half['pass_at_k']['1'])}, Pass@4 {_pct(half['pass_at_k'].get('4'))}"
    return f"{half['success_pct']:g}% of {half['episodes']}"


def _paired_cell(row: dict[str, Any]) -> str:
    got = row["paired"]
    if "pass_at_1" in got:
        return f"Pass@1 {_pct(got['pass_at_1'], True)}, Pass@4 {_pct(got['pass_at_4'], True)} ({got['pass_at_1']['tasks']} tasks)"
    return f"{got['gained']} gained / {got['lost']} lost, p {got['p_value']:.3g}" if got else "-"


def _sentence_cell(half: dict[str, Any]) -> str:
    low_high = half["sentence_wilson_pct"]
    span = f", {low_high[0]:g}-{low_high[1]:g}%" if low_high else ""
    return f"{half['sentence_succeeded']} of {half['sentence_episodes']}{span}"


LABELS = ("paper's recipe", "masked")   # the halves' names: reference, other (--labels)


def markdown(rows: list[dict[str, Any]], pairs_file: str, labels: tuple[str, str] = LABELS) -> str:
    a, b = labels
    head = (f"| model | eval | {a} | {b} | {b} - {a}, paired | refused / episode | "
            ">= 10 revision turns | failed, ending in >= 5 repeats of an accepted action | "
            "revision sentence: episodes won | machine |")
    flags = "" if labels == LABELS else f" --labels '{a},{b}'"
    lines = [f"# {b[:1].upper() + b[1:]} against {a}, pair by pair\n",
             f"Written by `python -m reproduction.pair_table --pairs {pairs_file}{flags}` from the banked episodes "
             f"(restore the banks first). Each cell under two halves reads {a} -> {b}.\n",
             head, "|" + "---|" * 10]
    for row in rows:
        if "pending" in row:
            lines.append(f"| {row['model']} | {row['eval']} | pending: {row['pending']} | | | | | | | |")
            continue
        ref, other = row["reference_figures"], row["other_figures"]
        machines = [half["provenance"].get("machines") or ["unknown"] for half in (ref, other)]
        machine = ", ".join(machines[0]) + ("" if machines[1] == machines[0] else " / " + ", ".join(machines[1]))
        lines.append(
            f"| {row['model']} | {row['eval']} | {_success_cell(ref)} | {_success_cell(other)} | {_paired_cell(row)} | "
            f"{ref['refused_per_episode']:.2f} -> {other['refused_per_episode']:.2f} | "
            f"{ref['ten_or_more_revisions']} -> {other['ten_or_more_revisions']} | "
            f"{ref['failed_ending_in_accepted_repeats']} -> {other['failed_ending_in_accepted_repeats']} | "
            f"{_sentence_cell(ref)} -> {_sentence_cell(other)} | {machine}, {ref['provenance'].get('dtype')} |")
    notes = [f"* {row['model']}, {row['eval']}: {row['note']}" for row in rows if row.get("note")]
    notes += [f"* {row['model']}, {row['eval']}: {w}" for row in rows for w in row.get("provenance_warnings", [])]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def plot(rows: list[dict[str, Any]], path: Path, labels: tuple[str, str] = LABELS) -> Path:
    """The other half's paired difference from the reference's, one line a
    finished pair: Pass@1 with its bootstrap interval where sampled, the
    success difference in points (no interval; McNemar's p in the label)
    where greedy."""
    plt = plots._pyplot()
    done = [row for row in rows if "pending" not in row]
    numbers, ticks = {}, []
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(done) + 1.8))
    for y, row in enumerate(done):
        got, label = row["paired"], f"{row['model']}, {row['eval']}"
        if "pass_at_1" in got:
            value, (low, high) = 100 * got["pass_at_1"]["value"], [100 * x for x in got["pass_at_1"]["ci95"]]
            ax.errorbar(value, y, xerr=[[value - low], [high - value]], fmt="o", color="C0", capsize=3)
            numbers[label] = {"pass_at_1_points": round(value, 2), "ci95": [round(low, 2), round(high, 2)]}
        else:
            value = 100 * (got["gained"] - got["lost"]) / got["tasks"]
            ax.plot(value, y, "s", mfc="none", color="C1")
            label += f" (p {got['p_value']:.2g})"
            numbers[label] = {"success_points": round(value, 2)}
        ticks.append(label)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(done)), ticks, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel=f"{labels[1]} - {labels[0]}, points\n(circles: sampled Pass@1 with its 95% paired interval; "
                  "squares: greedy success)",
           title=f"{labels[1]} against {labels[0]}\n(each pair's machines: results.md)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return plots.save(fig, path, numbers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", required=True, help="JSON list of {model, eval, reference, other[, note]}")
    parser.add_argument("--out", help="folder for results.json/md/png (default: the pairs file's folder)")
    parser.add_argument("--labels", default=",".join(LABELS),
                        help="the two halves' names, reference first (default: %(default)s)")
    args = parser.parse_args(argv)
    labels = tuple(part.strip() for part in args.labels.split(","))
    if len(labels) != 2 or not all(labels):
        raise UsageError(f"--labels {args.labels!r}: give two names, the reference's first, e.g. 'masked,cleaned'")
    try:
        pairs = read_json(args.pairs)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the pairs file {args.pairs}: {exc}") from None
    if not isinstance(pairs, list) or not all(isinstance(p, dict) and {"model", "eval", "reference", "other"} <= set(p)
                                              for p in pairs):
        raise UsageError(f"{args.pairs} must be a JSON list of objects with model, eval, reference and other")
    out = Path(args.out or Path(args.pairs).parent)
    rows = [measure(pair) for pair in pairs]
    atomic_write_json(out / paths.RESULTS_JSON, {"pairs_file": args.pairs, "rows": rows})
    atomic_write_text(out / paths.RESULTS_MD, markdown(rows, args.pairs, labels))
    plot(rows, out / paths.RESULTS_PNG, labels)
    finished = sum(1 for row in rows if "pending" not in row)
    print(f"{finished} of {len(rows)} pairs finished; results.json/md/png in {out}")
    return 0


if __name__ == "__main__":
    run_cli(main)
