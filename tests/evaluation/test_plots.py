"""The PNGs: eval.py --compare --plot draws the runs' success and loop
statistics (the numbers drawn kept in the PNG, written atomically), --plot
needs --compare, and iterate.py's results.png comes from the same helper."""
import json
from pathlib import Path

import pytest

import eval as eval_script
from agent_r.evaluation import EvalSettings
from agent_r.settings import UsageError, parse
from tests.support import tree_fixtures as tf


def eval_run(folder: Path, scores: list[float], actions: list[list[str]]) -> str:
    folder.mkdir(parents=True)
    for i, (score, acts) in enumerate(zip(scores, actions)):
        state = tf.make_root().state
        for a in acts:
            state = state + [{"role": "assistant", "content": f"Thought: go.\nAction: {a}"},
                             {"role": "user", "content": "obs"}]
        (folder / f"search_results_{i}.json").write_text(json.dumps(
            {"task_id": i, "env_score": score, "step_num": len(acts), "state": state, "success": score >= 1}))
    return str(folder)


def test_compare_plot_writes_a_png_of_the_runs(tmp_path, capsys):
    base = eval_run(tmp_path / "textcraft" / "iter0", [0.0, 0.0, 1.0, 0.0],
                    [["a", "a", "a"], ["b", "c", "b", "c"], ["x"], ["y"]])
    new = eval_run(tmp_path / "textcraft" / "iter1", [1.0, 1.0, 0.0, 1.0], [["a"], ["b"], ["c", "c"], ["d"]])
    png = tmp_path / "plots" / "compare.png"
    assert eval_script.main(["--compare", base, new, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "iter0" in out and f"plot: {png}" in out
    # the same four tasks, paired with the first run: iter1 solves 3 that iter0 does not, loses 1
    paired = [line for line in out.splitlines() if line.startswith("vs first")]
    assert len(paired) == 1 and "3 / 1 (p" in paired[0], out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    from PIL import Image
    with Image.open(png) as image:
        assert image.size[0] > 800
        numbers = json.loads(image.text["Description"])
    assert numbers["iter0"]["success_pct"] == 25.0 and numbers["iter1"]["success_pct"] == 75.0
    assert numbers["iter0"]["loop_pct"]["1"] == 25.0 and numbers["iter0"]["loop_pct"]["2"] == 25.0
    assert numbers["iter1"]["loop_pct"]["1"] == 25.0 and numbers["iter1"]["score_x100"] == 75.0
    assert not list(png.parent.glob(".*tmp*"))


def test_compare_figure_draws_the_numbers():
    from agent_r import plots

    numbers = {"a": {"success_pct": 20.0, "score_x100": 30.0, "tasks": 5, "loop_pct": {str(k): k for k in range(1, 6)}},
               "b": {"success_pct": 60.0, "score_x100": 65.0, "tasks": 5, "loop_pct": {str(k): 0 for k in range(1, 6)}}}
    fig = plots.compare_figure(numbers)
    left, right = fig.axes
    assert [round(p.get_height(), 6) for p in left.patches] == [20.0, 30.0, 60.0, 65.0]
    assert [p.get_height() for p in right.patches] == [1, 2, 3, 4, 5, 0, 0, 0, 0, 0]


def test_plot_needs_compare():
    with pytest.raises(UsageError, match="--plot"):
        parse(EvalSettings, ["--plot", "x.png"], {"TASK": "textcraft"})


def test_iterate_results_png_comes_from_the_same_helper(tmp_path):
    from types import SimpleNamespace

    from PIL import Image

    from agent_r.loop import results

    s = SimpleNamespace(tasks=["textcraft", "sciworld"], variant_list=["agent-r", "direct"], iterations=1, eval_samples=1)
    test = lambda a, b: {"textcraft": {"success_pct": a, "tasks": 100}, "sciworld": {"success_pct": b}}  # noqa: E731
    rows = [{"iteration": 0, "variant": "base", "test": test(10.0, 20.0)},
            {"iteration": 1, "variant": "agent-r", "test": test(30.0, 50.0)},
            {"iteration": 1, "variant": "direct", "test": test(20.0, 20.0)}]
    results.write_plot(s, rows, tmp_path / "results.png")
    with Image.open(tmp_path / "results.png") as image:
        panels = json.loads(image.text["Description"])
    # a point with its task count carries Wilson's 95% interval (30 of 100: 21.89-39.59), one without has none
    assert panels["textcraft"]["agent-r"] == [[0, 10.0, 5.52, 17.44], [1, 30.0, 21.89, 39.59]]
    assert panels["sciworld"]["agent-r"] == [[0, 20.0], [1, 50.0]]
    assert panels["average"]["direct"] == [[0, 15.0], [1, 20.0]] and set(panels) == {"textcraft", "sciworld", "average"}


def test_losses_png_draws_every_fine_tunes_loss_per_iteration(tmp_path):
    """losses.png: one panel per iteration, one line per variant, each the
    fine-tune's per-step training loss; rows without recorded losses (the
    base model, a fine-tune of an older run) draw nothing."""
    from PIL import Image

    from agent_r.loop import results

    rows = [{"iteration": 0, "variant": "base"},
            {"iteration": 2, "variant": "agent-r", "train": {"losses": [1.0, 0.5]}},
            {"iteration": 1, "variant": "agent-r", "train": {"losses": [2.0, 1.5, 1.0]}},
            {"iteration": 1, "variant": "good", "train": {"first_loss": 1.0}}]
    results.write_loss_plot(rows, tmp_path / "losses.png")
    with Image.open(tmp_path / "losses.png") as image:
        panels = json.loads(image.text["Description"])
    assert panels == {"iteration 1": {"agent-r": [2.0, 1.5, 1.0]}, "iteration 2": {"agent-r": [1.0, 0.5]}}
    results.write_loss_plot(rows[:1], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["losses.png"]   # no temporary file left
