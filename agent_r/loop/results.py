"""The run's results files, rebuilt from the finished rows after every
iteration of every variant: results.json (every row and the settings),
results.md (the success table and per-iteration statistics) and results.png."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from agent_r import plots
from agent_r.io import atomic_write_json, atomic_write_text
from agent_r.loop.layout import RESULTS_JSON, RESULTS_MD, RESULTS_PNG, Layout
from agent_r.loop.settings import IterateSettings
from agent_r.settings import manifest_config


def average(row: dict, key: str) -> Optional[float]:
    values = [v[key] for v in row.get("test", {}).values()]
    return round(sum(values) / len(values), 4) if values else None


def markdown(s: IterateSettings, rows: list[dict]) -> str:
    """results.md: test success per task and iteration, then the statistics."""
    tasks = s.tasks
    head = ["iteration", "variant", *[f"{t} success %" for t in tasks]] + (["average"] if len(tasks) > 1 else [])
    lines = [f"# Agent-R self-training: {s.name}", "",
             f"Test success % (TEMP={s.eval_temperature:g}, at most {s.eval_max_steps} turns, "
             f"{'all' if s.eval_limit is None else f'the first {s.eval_limit}'} test tasks per task); "
             "iteration 0 is the base model.", "", _md_row(head), _md_row(["---"] * len(head))]
    for r in rows:
        cells = [str(r["iteration"]), r["variant"], *[_fmt(r["test"].get(t, {}).get("success_pct")) for t in tasks]]
        lines.append(_md_row(cells + ([_fmt(average(r, "success_pct"))] if len(tasks) > 1 else [])))
    stat_head = ["iteration", "variant", "revision samples", "good samples", "train samples", "mean first bad step",
                 "loop k=1 % episodes", "revision-task success %", "train loss first -> last"]
    lines += ["", "Per-iteration statistics (summed over tasks; loop and revision task: mean over tasks).", "",
              _md_row(stat_head), _md_row(["---"] * len(stat_head))]
    lines += [_md_row(_stat_cells(r)) for r in rows]
    return "\n".join(lines) + "\n"


def _stat_cells(r: dict) -> list[str]:
    per_task = r.get("data", {}).get("tasks", {}).values()
    firsts = [t["mean_first_bad_step"] for t in per_task if t.get("mean_first_bad_step") is not None]
    loops = [t["loops_pct"]["1"] for t in r.get("test", {}).values()]
    revise = [t["success_pct"] for t in r.get("revise_task", {}).values()]
    train = r.get("train") or {}
    loss = f"{train['first_loss']:.3f} -> {train['last_loss']:.3f}" if train.get("first_loss") is not None else "-"
    mean = lambda xs: _fmt(sum(xs) / len(xs)) if xs else "-"  # noqa: E731
    return [str(r["iteration"]), r["variant"],
            *[str(sum(t.get(k, 0) for t in per_task)) if r["iteration"] else "-"
              for k in ("revision_samples", "good_samples")],
            str(r.get("data", {}).get("train_samples", "-")), mean(firsts), mean(loops), mean(revise), loss]


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"


def write_plot(s: IterateSettings, rows: list[dict], path: Path) -> None:
    """results.png: test success % per iteration, one line per variant (each
    starts at the base model), one panel per task plus the average."""
    value = lambda r, t: average(r, "success_pct") if t == "average" else r["test"][t]["success_pct"]  # noqa: E731
    base = [r for r in rows if r["iteration"] == 0]
    panels = {t: {variant: [(r["iteration"], value(r, t)) for r in base + [r for r in rows if r["variant"] == variant]]
                  for variant in s.variant_list}
              for t in s.tasks + (["average"] if len(s.tasks) > 1 else [])}
    plots.iteration_lines(panels, s.iterations, path)


def write_results(s: IterateSettings, layout: Layout, rows: list[dict], trainer: str) -> None:
    """results.json, results.md and results.png, each replaced atomically."""
    atomic_write_json(layout.results(RESULTS_JSON), {
        "name": s.name, "tasks": s.tasks, "variants": s.variant_list, "iterations": s.iterations,
        "train_from": s.train_from, "trainer": trainer, "config": manifest_config(s), "rows": rows})
    atomic_write_text(layout.results(RESULTS_MD), markdown(s, rows))
    write_plot(s, rows, layout.results(RESULTS_PNG))
