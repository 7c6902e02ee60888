"""The run's results files, rebuilt from the finished rows after every
iteration of every variant: results.json (every row and the settings),
results.md (the success table, the paired comparisons and per-iteration
statistics), results.png (test success) and losses.png (every fine-tune's
training loss).

The paired comparisons (agent_r/loop/stats.py) are derived from the rows'
per-episode outcomes each time the files are written, so they always cover
every finished row; in results.json each row carries them as ``paired``."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from agent_r import passk, plots
from agent_r.io import atomic_write_json, atomic_write_text
from agent_r.significance import wilson_interval
from agent_r.paths import LOSSES_PNG, RESULTS_JSON, RESULTS_MD, RESULTS_PNG, Layout, portable_paths
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stats import comparisons
from agent_r.settings import manifest_config

LOOP_KS = ("1", "2", "3", "4")   # repeated action sequences of length 1-4 (paper Fig. 4)
WAIT_OK_NOTE = ", WAIT_REPLY=ok: the revision turn's `wait` answered `ok.` as in training, not by the env"


def average(row: dict, key: str) -> Optional[float]:
    values = [v[key] for v in row.get("test", {}).values()]
    return round(sum(values) / len(values), 4) if values else None


def with_comparisons(rows: list[dict]) -> list[dict]:
    """The rows, each model row with its ``paired`` comparisons."""
    paired = comparisons(rows)
    return [{**r, "paired": paired[(r["iteration"], r["variant"])]} if (r["iteration"], r["variant"]) in paired
            else r for r in rows]


def markdown(s: IterateSettings, rows: list[dict]) -> str:
    """results.md: test success per task and iteration, the paired
    comparisons, then the statistics."""
    tasks = s.tasks
    head = ["iteration", "variant", *[f"{t} success %" for t in tasks]] + (["average"] if len(tasks) > 1 else [])
    lines = [f"# Agent-R self-training: {s.name}", "",
             f"Test success % (TEMP={s.eval_temperature:g}, at most {s.eval_max_steps} turns, "
             f"{'all' if s.eval_limit is None else f'the first {s.eval_limit}'} test tasks per task"
             f"{WAIT_OK_NOTE if s.wait_reply == 'ok' else ''}); iteration 0 is the base model.", "",
             _md_row(head), _md_row(["---"] * len(head))]
    for r in rows:
        cells = [str(r["iteration"]), r["variant"], *[_fmt(r["test"].get(t, {}).get("success_pct")) for t in tasks]]
        lines.append(_md_row(cells + ([_fmt(average(r, "success_pct"))] if len(tasks) > 1 else [])))
    lines += _dtype_note(rows)
    lines += _machine_note(rows)
    lines += _paired_table(rows)
    lines += _sampled_table(s, rows)
    stat_head = ["iteration", "variant", "ALPHA / epochs / LR", "revision samples", "good samples", "train samples",
                 "mean first bad step", "loops k=1/2/3/4 % episodes", "revision-task success %",
                 "test episodes with a revision turn (succeeded)", "train loss first -> last"]
    lines += ["", "Per-iteration statistics (summed over tasks; loops and revision task: mean over tasks). "
              f"Revision task: the base model's failed test episodes, each cut at a random step, continued for "
              f"at most {s.revise_max_steps} turns.", "", _md_row(stat_head), _md_row(["---"] * len(stat_head))]
    lines += [_md_row(_stat_cells(r)) for r in rows]
    return "\n".join(lines) + "\n"


def _dtype_note(rows: list[dict]) -> list[str]:
    """One line when the table's evals ran at more than one dtype (machines
    differ: a CPU without native bf16 runs fp32), naming each row's, so that
    a mixed table says so; nothing when they agree or were not recorded."""
    seen = {(r["iteration"], r["variant"]): sorted({part.get(t, {}).get("dtype") for part in (r.get("test", {}),)
                                                    for t in part} - {None}) for r in rows}
    if len({d for ds in seen.values() for d in ds}) < 2:
        return []
    named = ", ".join(f"{v} {k}: {'/'.join(ds) or '?'}" for (k, v), ds in seen.items())
    return ["", f"Mixed dtypes: these evals did not all run at one dtype ({named}); pair rows of one dtype only, "
            "or evaluate again under an EVAL_TAG of its own (docs/iterate.md)."]


def _machine_note(rows: list[dict]) -> list[str]:
    """One line when the table's evals name more than one machine (each
    eval's ``provenance``): paired rows across machines carry the drift of a
    rerun elsewhere, so the table says which row ran where; nothing when one
    machine made them all, or none is recorded."""
    seen = {(r["iteration"], r["variant"]): sorted({m for part in (r.get("test", {}), r.get("revise_task", {}))
                                                    for entry in part.values() if isinstance(entry, dict)
                                                    for m in (entry.get("provenance") or {}).get("machines", [])}
                                                   - {"unknown"}) for r in rows}
    if len({m for ms in seen.values() for m in ms}) < 2:
        return []
    named = "; ".join(f"{v} {k}: {' + '.join(ms) or 'unknown'}" for (k, v), ms in seen.items())
    return ["", f"Mixed machines: these evals did not all run on one machine ({named}); a pair of rows from two "
            "machines differs by the machines too (reruns elsewhere have moved a model by a few episodes)."]


def _paired_table(rows: list[dict]) -> list[str]:
    """Gained / lost test tasks and McNemar's exact p against the base model
    (every model) and against direct (agent-r), per task."""
    paired = comparisons(rows)
    cells = []
    for r in rows:
        for part, label in (("test", "test"), ("revise_task", "revision task")):
            for task, entry in paired.get((r["iteration"], r["variant"]), {}).get(part, {}).items():
                cells.append([str(r["iteration"]), r["variant"], f"{task} {label}",
                              _pair(entry.get("vs_base")), _pair(entry.get("vs_direct"))])
    if not cells:
        return []
    head = ["iteration", "variant", "episodes", "vs base: gained / lost (p)", "vs direct: gained / lost (p)"]
    return ["", "Paired comparisons on the same episodes: episodes solved only by this model / only by the "
            "other, and McNemar's exact two-sided p-value.", "", _md_row(head), _md_row(["---"] * len(head)),
            *[_md_row(c) for c in cells]]


def _sampled_table(s: IterateSettings, rows: list[dict]) -> list[str]:
    """EVAL_SAMPLES > 1: Pass@1 and Pass@K of every model with 95% intervals
    over tasks, and Pass@K's difference from the base model paired by task
    (agent_r/passk.py): does training widen what the model can solve, or
    only make it surer of what it already solved?"""
    sampled = [r for r in rows if r.get("sampled")]
    if not sampled:
        return []
    k = s.eval_samples
    base = next((r["sampled"]["test"] for r in sampled if r["iteration"] == 0), {})
    head = ["iteration", "variant"]
    for t in s.tasks:
        head += [f"{t} pass@1 %", f"{t} pass@{k} %", f"{t} pass@{k} - base (paired)"]
    lines = ["", f"Pass@k: {k} episodes per test task at TEMP={s.eval_sample_temperature:g} (unbiased estimator, "
             "95% bootstrap interval over tasks).", "", _md_row(head), _md_row(["---"] * len(head))]
    for r in sampled:
        cells = [str(r["iteration"]), r["variant"]]
        for t in s.tasks:
            got = r["sampled"]["test"].get(t) or {}
            at = got.get("pass_at_k", {})
            diff = (passk.paired_difference(base[t]["per_task"], got["per_task"], k)
                    if r["iteration"] and t in base and got else None)
            cells += [passk.percent_cell(at.get("1")), passk.percent_cell(at.get(str(k))),
                      passk.percent_cell(diff, signed=True)]
        lines.append(_md_row(cells))
    return lines


def _pair(p: Optional[dict]) -> str:
    return "-" if not p else f"{p['gained']} / {p['lost']} ({p['p_value']:.3g})"


def _stat_cells(r: dict) -> list[str]:
    per_task = r.get("data", {}).get("tasks", {}).values()
    firsts = [t["mean_first_bad_step"] for t in per_task if t.get("mean_first_bad_step") is not None]
    tests = list(r.get("test", {}).values())
    loops = "/".join(mean([t["loops_pct"][k] for t in tests if k in t.get("loops_pct", {})]) for k in LOOP_KS)
    revise = [t["success_pct"] for t in r.get("revise_task", {}).values()]
    turns = [t["revision_turns"] for t in tests if "revision_turns" in t]
    turn_cell = f"{sum(t['episodes'] for t in turns)} ({sum(t['succeeded'] for t in turns)})" if turns else "-"
    train = r.get("train") or {}
    loss = f"{train['first_loss']:.3f} -> {train['last_loss']:.3f}" if train.get("first_loss") is not None else "-"
    return [str(r["iteration"]), r["variant"], settings_cell(r),
            *[str(sum(t.get(k, 0) for t in per_task)) if r["iteration"] else "-"
              for k in ("revision_samples", "good_samples")],
            str(r.get("data", {}).get("train_samples", "-")), mean(firsts), loops, mean(revise), turn_cell, loss]


def settings_cell(r: dict) -> str:
    """ALPHA / epochs / LR of a model row (eto: no ALPHA, and DPO's beta);
    "-" for the base model."""
    if "epochs" not in r:
        return "-"
    alpha = "/".join(f"{a:.3g}" for a in (r.get("alpha") or {}).values()) or "-"
    lr = f" / {r['lr']:.3g}" if r.get("lr") is not None else ""
    beta = f" (beta {r['beta']:.3g})" if r.get("beta") is not None else ""
    return f"{alpha} / {r['epochs']}{lr}{beta}"


def settings_label(variant: str, rows: list[dict]) -> str:
    """A plot's label of ``variant``: its name and the training settings of
    ``rows`` (its model rows; a value that changes across them is listed per
    iteration), e.g. "agent-r (epochs 3/1, LR 2e-05)", "eto (DPO: epochs 3,
    LR 1e-06, beta 0.1)"."""
    rows = [r for r in rows if "epochs" in r]
    if not rows:
        return variant
    parts = []
    for key, name in (("epochs", "epochs"), ("lr", "LR"), ("beta", "beta")):
        seen = [f"{r[key]:.3g}" for r in rows if r.get(key) is not None]
        if seen:
            parts.append(f"{name} {seen[0] if len(set(seen)) == 1 else '/'.join(seen)}")
    dpo = "DPO: " if any(r.get("beta") is not None for r in rows) else ""
    return f"{variant} ({dpo}{', '.join(parts)})"


def mean(xs: list[float]) -> str:
    return _fmt(sum(xs) / len(xs)) if xs else "-"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"


def success_point(r: dict, t: str) -> tuple:
    """(iteration, test success %) with Wilson's 95% interval where the row
    counts its tasks (the average of several tasks has none)."""
    if t == "average":
        return r["iteration"], average(r, "success_pct")
    got = r["test"][t]
    n = got.get("tasks") or 0
    interval = wilson_interval(round(got["success_pct"] * n / 100), n) if n else None
    if interval is None:
        return r["iteration"], got["success_pct"]
    return r["iteration"], got["success_pct"], round(100 * interval[0], 2), round(100 * interval[1], 2)


def write_plot(s: IterateSettings, rows: list[dict], path: Path) -> None:
    """results.png: test success % per iteration with 95% intervals, one line
    per variant (each starts at the base model), one panel per task plus the
    average."""
    base = [r for r in rows if r["iteration"] == 0]
    panels = {t: {variant: [success_point(r, t) for r in base + [r for r in rows if r["variant"] == variant]]
                  for variant in s.variant_list}
              for t in s.tasks + (["average"] if len(s.tasks) > 1 else [])}
    for t in s.tasks if s.eval_samples > 1 else []:   # Pass@1 and Pass@K of the sampled evals
        for k in ("1", str(s.eval_samples)):
            panels[f"{t} pass@{k} % (TEMP={s.eval_sample_temperature:g})"] = {
                variant: [(r["iteration"], *(round(100 * x, 4) for x in (
                              r["sampled"]["test"][t]["pass_at_k"][k]["value"],
                              *r["sampled"]["test"][t]["pass_at_k"][k]["ci95"])))
                          for r in base + [r for r in rows if r["variant"] == variant]
                          if k in ((r.get("sampled") or {}).get("test", {}).get(t) or {}).get("pass_at_k", {})]
                for variant in s.variant_list}
    labels = {variant: settings_label(variant, [r for r in rows if r["variant"] == variant])
              for variant in s.variant_list}
    plots.iteration_lines(panels, s.iterations, path, labels)


def write_loss_plot(rows: list[dict], path: Path) -> None:
    """losses.png: every fine-tune's training loss per optimizer step, one
    panel per iteration, one line per variant; not drawn before a fine-tune
    has recorded its losses."""
    panels: dict[str, dict[str, list[float]]] = {}
    labels: dict[str, dict[str, str]] = {}
    for r in sorted(rows, key=lambda r: r["iteration"]):
        losses = (r.get("train") or {}).get("losses")
        if losses:
            panels.setdefault(f"iteration {r['iteration']}", {})[r["variant"]] = losses
            labels.setdefault(f"iteration {r['iteration']}", {})[r["variant"]] = settings_label(r["variant"], [r])
    if panels:
        plots.loss_curves(panels, path, labels)


def write_results(s: IterateSettings, layout: Layout, rows: list[dict], trainer: str) -> None:
    """results.json, results.md and results.png, each replaced atomically;
    results.json names files relative to the run or the repository
    (``paths.portable``), so a run copied elsewhere reads the same."""
    atomic_write_json(layout.results(RESULTS_JSON), portable_paths({
        "name": s.name, "tasks": s.tasks, "variants": s.variant_list, "iterations": s.iterations,
        "train_from": s.train_from, "trainer": trainer, "wait_reply": s.wait_reply, "config": manifest_config(s),
        "search_tasks": getattr(s, "search_tasks", {}), "rows": with_comparisons(rows)}, layout.root))
    atomic_write_text(layout.results(RESULTS_MD), markdown(s, rows))
    write_plot(s, rows, layout.results(RESULTS_PNG))
    if not layout.eval_suffix():   # the fine-tunes are the same whatever the evals: one loss plot
        write_loss_plot(rows, layout.results(LOSSES_PNG))
