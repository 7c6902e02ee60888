"""Result plots as PNG files: iterate.py's results.png and losses.png and
``eval.py --compare ... --plot FILE``.

One home for figures so both share matplotlib's Agg backend (no display on a
cluster node or in CI), the atomic write (a killed run never leaves half a
PNG) and the numbers drawn, kept in the PNG's "Description" text chunk as
JSON: the picture says what it shows to a reader and to a test.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from agent_r.report import LOOP_LENGTHS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | os.PathLike, numbers: Any, legend: Any = None) -> Path:
    """Write ``fig`` to ``path`` atomically, with ``numbers`` as the PNG's
    description (and ``legend``, the drawn line labels where they say more
    than the numbers' keys, as its "Legend" text). The temporary file's name
    is this call's own: several processes of one run (the loop's variants
    side by side) may draw the same figure at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    tmp = Path(name)
    try:
        metadata = {"Description": json.dumps(numbers, sort_keys=True)}
        if legend is not None:
            metadata["Legend"] = json.dumps(legend, sort_keys=True)
        fig.savefig(tmp, dpi=100, metadata=metadata)
        os.replace(tmp, path)
    finally:
        _pyplot().close(fig)
        tmp.unlink(missing_ok=True)
    return path


def iteration_lines(panels: dict[str, dict[str, list[tuple]]], iterations: int,
                    path: str | os.PathLike, labels: Optional[dict[str, str]] = None) -> Path:
    """One panel per task (and the average): test success % against the
    self-training iteration, one line per variant, labelled ``labels[variant]``
    (e.g. with its training settings) where given. A point ``(x, y, low,
    high)`` carries its 95% interval, drawn as an error bar; each variant's
    bars sit a little apart so that tied points keep theirs visible."""
    plt = _pyplot()
    labels = labels or {}
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for i, (name, points) in enumerate(lines.items()):
            # variants often tie: each its own marker, dash and size, so a line under another still shows
            shift = 0.06 * (i - (len(lines) - 1) / 2)
            xs, ys = [p[0] + shift for p in points], [p[1] for p in points]
            drawn = ax.plot(xs, ys, marker="osD^v"[i % 5], linestyle=("-", "--", ":", "-.")[i % 4],
                            markersize=9 - 1.5 * (i % 4), label=labels.get(name, name))
            bars = [(x, p) for x, p in zip(xs, points) if len(p) == 4]
            if bars:
                ax.errorbar([x for x, _ in bars], [p[1] for _, p in bars],
                            yerr=[[p[1] - p[2] for _, p in bars], [p[3] - p[1] for _, p in bars]],
                            fmt="none", ecolor=drawn[0].get_color(), elinewidth=1, capsize=3, alpha=0.6)
        ax.set(title=title, xlabel="iteration", ylabel="test success %")
        ax.set_ylim(bottom=0)
        ax.set_xticks(range(iterations + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, panels, {name: labels.get(name, name) for lines in panels.values() for name in lines})


def loss_curves(panels: dict[str, dict[str, list[float]]], path: str | os.PathLike,
                labels: Optional[dict[str, dict[str, str]]] = None) -> Path:
    """One panel per fine-tune round (iteration): the training loss of every
    logged optimizer step, one line per variant, labelled
    ``labels[panel][variant]`` (e.g. with its training settings) where given."""
    plt = _pyplot()
    labels = labels or {}
    drawn = {title: {name: labels.get(title, {}).get(name, name) for name in lines} for title, lines in panels.items()}
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for name, losses in lines.items():
            ax.plot(range(1, len(losses) + 1), losses, label=drawn[title][name])
        ax.set(title=title, xlabel="optimizer step", ylabel="training loss")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, panels, drawn)


def compare_numbers(summaries: Sequence[dict], labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What the compare plot draws, per run label."""
    return {label: {"success_pct": 100 * s["success_rate"], "score_x100": s["score_x100"], "tasks": s["tasks"],
                    "loop_pct": {str(k): 100 * s["loops"][str(k)]["fraction"] for k in LOOP_LENGTHS}}
            for s, label in zip(summaries, labels)}


def compare_figure(numbers: dict[str, dict[str, Any]]) -> Any:
    """Left: success % and score x100 per run. Right: % of episodes with a
    loop of period k (report.count_repeats), runs side by side per k."""
    plt = _pyplot()
    runs = list(numbers)
    width = 0.8 / max(len(runs), 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, run in enumerate(runs):
        n = numbers[run]
        bars = left.bar([j + (i - (len(runs) - 1) / 2) * width for j in range(2)],
                        [n["success_pct"], n["score_x100"]], width, label=f"{run} ({n['tasks']} tasks)")
        left.bar_label(bars, fmt="%.1f", fontsize=8)
        right.bar([k + (i - (len(runs) - 1) / 2) * width for k in LOOP_LENGTHS],
                  [n["loop_pct"][str(k)] for k in LOOP_LENGTHS], width, label=run)
    left.set_xticks(range(2), ["success %", "score x100"])
    left.set(title="success per run", ylim=(0, 105))
    right.set_xticks(list(LOOP_LENGTHS), [f"k={k}" for k in LOOP_LENGTHS])
    right.set(title="episodes with a loop of period k", ylabel="% of episodes", ylim=(0, 105))
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def compare_plot(summaries: Sequence[dict], labels: Sequence[str], path: str | os.PathLike) -> Path:
    """``eval.py --compare RUN... --plot FILE``: the runs' success and loops as a PNG."""
    numbers = compare_numbers(summaries, labels)
    return save(compare_figure(numbers), path, numbers)
