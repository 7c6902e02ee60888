"""What CLEAN_PATHS cut from a run's rows, per iteration and variant: the
counts each data stage's done-marker records (agent_r/clean.py), as one
markdown table.

    python -m reproduction.clean_table --run runs/smollm2-clean [--out reproduction/smollm2-clean/cleaning.md]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from agent_r.io import atomic_write_text, read_json
from agent_r.settings import UsageError, run_cli

HEADER = ("| iteration | variant | rows kept | left out | continuation steps | cut: refused | cut: unneeded | "
          "cut: after the goal | kept | spliced rows that replay as recorded |\n|---|---|---:|---:|---:|---:|---:|---:|"
          "---:|---:|")


def pct(part: int, whole: int) -> str:
    return f"{part:,} ({100 * part / whole:.0f}%)" if whole else "-"


def table(run: Path) -> str:
    lines = []
    for marker in sorted(run.glob("iter_*/data/*/.done.json")):
        stats = read_json(marker).get("stats") or {}
        c = stats.get("clean")
        if not stats.get("clean_paths") or not c:
            continue
        k, variant = marker.parts[-4].removeprefix("iter_"), marker.parts[-2]
        steps = c["steps_before"]
        kept_steps = steps - c["refused_cut"] - c["unneeded_cut"] - c["after_goal_cut"]
        lines.append(f"| {k} | {variant} | {c['kept']:,} of {c['rows']:,} | {c['left_out']} | {steps:,} | "
                     f"{pct(c['refused_cut'], steps)} | {pct(c['unneeded_cut'], steps)} | {c['after_goal_cut']} | "
                     f"{pct(kept_steps, steps)} | "
                     + (f"{pct(c['spliced_as_recorded'], c['spliced'])} of {c['spliced']}" if c["spliced"] else "-")
                     + " |")
    if not lines:
        raise UsageError(f"{run} has no data stage made with CLEAN_PATHS=1 (iter_<k>/data/<variant>/.done.json)")
    return "\n".join([HEADER, *lines]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run folder of iterate.py made with CLEAN_PATHS=1")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    text = table(Path(args.run))
    print(text, end="")
    if args.out:
        atomic_write_text(Path(args.out), text)
    return 0


if __name__ == "__main__":
    run_cli(main)
