"""The paper's settings in the loop: ALPHA and EPOCHS per iteration (a comma
list; one value for every iteration; unset = the paper's 0.5/0.7/1.0 and
3/1/1), the base model's own training tasks never searched, and general data
(here a model's own training conversations) mixed at ETA by the CPU trainer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_r.loop import IterateSettings, run
from agent_r.loop.models import Policy
from agent_r.loop.stages import path_settings
from agent_r.revision_data import PathSettings
from agent_r.settings import IntSchedule, UsageError, manifest_config, parse
from agent_r.training import cpu
from agent_r.training.settings import TrainKnobs, TrainSettings
from tests.loop.conftest import FLAGS, SMALL, settings_for


# --------------------------------------------------------------------------- schedules

def test_alpha_and_epochs_take_one_value_per_iteration(tmp_path):
    s = parse(IterateSettings, [], {"ALPHA": "0.3,0.6", "EPOCHS": "4,2,1"})
    assert [s.alpha_for("textcraft", k) for k in (1, 2, 3)] == [0.3, 0.6, 0.6]   # the last holds after the list
    assert [s.epochs_for(k) for k in (1, 2, 3, 4)] == [4, 2, 1, 1]
    assert s.train_knobs(2).epochs == 2 and type(s.train_knobs(2).epochs) is int
    p = Policy("m", "m", s.backend)
    assert [path_settings(s, "textcraft", tmp_path, tmp_path, "good", False, p, k).alpha for k in (1, 2)] == [0.3, 0.6]
    assert manifest_config(s)["pairs"]["alpha"] == [0.3, 0.6] and manifest_config(s)["train"]["epochs"] == [4, 2, 1]
    one = parse(IterateSettings, [], {"ALPHA": "0.4", "EPOCHS": "2"})
    assert [one.alpha_for("textcraft", k) for k in (1, 2, 3)] == [0.4] * 3 and [one.epochs_for(k) for k in (1, 3)] == [2, 2]
    assert parse(IterateSettings, [], {"EPOCHS": "3,1", "TRAIN_FROM": "base"}).epochs_for(2) == 3   # from base: the first


def test_unset_the_loop_uses_the_papers_schedules_on_each_tasks_scale():
    s = parse(IterateSettings, [], {})
    assert [s.epochs_for(k) for k in (1, 2, 3)] == [3, 1, 1]
    assert [round(s.alpha_for("textcraft", k), 6) for k in (1, 2, 3)] == [0.5, 0.7, 1.0]
    assert [round(s.alpha_for("sciworld", k), 4) for k in (1, 2, 3)] == [50.0, 70.0, 100.0]
    # "> ALPHA" at the max score would keep nothing: alpha 1.0 keeps exactly the max-score leaves
    top = s.alpha_for("textcraft", 3)
    assert 0.999 < top < 1.0
    assert parse(IterateSettings, [], {"ALPHA": "0.5,1.5"}).alpha_for("textcraft", 2) == top


def test_one_iteration_scripts_read_a_list_as_its_first_value():
    ps = parse(PathSettings, [], {"TASK": "textcraft", "ALPHA": "0.5,0.7,1.0"})
    assert ps.alpha == 0.5 and ps.revision_config().alpha == 0.5 and type(ps.revision_config().alpha) is float
    ts = parse(TrainSettings, [], {"EPOCHS": "3,1,1"})
    assert ts.epochs == 3 and type(ts.epochs) is int         # the XTuner config gets a plain int
    assert parse(TrainSettings, [], {}).epochs == 3
    assert TrainKnobs().epochs == 3 and isinstance(TrainKnobs().epochs, IntSchedule)
    assert str(TrainKnobs().epochs) == "3,1,1"               # as XTuner's environment would read it back


@pytest.mark.parametrize("env, says", [
    ({"EPOCHS": "3,0,1"}, "EPOCHS=0 is too small"),
    ({"EPOCHS": "3,,1"}, "EPOCHS='3,,1' is not an integer or a comma list"),
    ({"ALPHA": "0.5,high"}, "ALPHA='0.5,high' is not a number or a comma list"),
    ({"BETA": "0.2,0.3"}, "BETA='0.2,0.3' is not a number"),          # BETA stays one value
])
def test_a_bad_schedule_is_one_clear_line(env, says):
    with pytest.raises(UsageError, match=None) as exc:
        parse(IterateSettings, [], env)
    assert says in str(exc.value) and "\n" not in str(exc.value)


# --------------------------------------------------------------------------- in the loop

def taught_model(base_model: str, folder: Path, policy: list[int], verifier: list[int]) -> str:
    model = folder / "base-with-tasks"
    shutil.copytree(base_model, model)
    (model / "training_tasks.json").write_text(json.dumps(
        {"task": "textcraft", "split": "train", "policy": policy, "verifier": verifier}))
    return str(model)


def test_each_iteration_gets_its_alpha_and_epochs_and_never_searches_the_base_models_tasks(
        base_model, textcraft_server, tmp_path, monkeypatch):
    handed = []

    def recording_trainer(model_dir, data_files, out_dir, knobs, seed=0, threads=0, **_):
        handed.append(knobs)
        shutil.copytree(model_dir, out_dir)
        return {"trainer": "cpu", "steps": 1, "first_loss": 1.0, "last_loss": 0.5}

    monkeypatch.setattr(cpu, "fine_tune", recording_trainer)
    model = taught_model(base_model, tmp_path, policy=[1, 2], verifier=[2, 3])
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": model, "VARIANTS": "good", "ALPHA": "0.5,0.7",
           "EPOCHS": "2,1"}
    result = run(settings_for(env, FLAGS + ["--max", "10", "--revise_limit", "0", "--env_server_base",
                                            textcraft_server, "--runs_dir", str(tmp_path), "--name", "paper"]))
    assert result.exit_code == 0, result.incomplete
    root = tmp_path / "paper"
    searched = {k: sorted(int(p.stem.rsplit("_", 1)[1]) for p in (root / f"iter_{k}" / "trees").rglob(
        "search_results_*.json")) for k in (1, 2)}
    assert searched[1] == searched[2] == [4, 6, 7, 8, 9]   # 1-3 taught, 0 and 5 test tasks
    results = json.loads((root / "results.json").read_text())
    assert results["search_tasks"]["textcraft"] == {"chosen": 8, "taught_left_out": 3, "searched": 5,
                                                    "task_list": "search_tasks_textcraft.json"}   # run-relative
    rows = {r["iteration"]: r for r in results["rows"]}
    assert [round(rows[k]["alpha"]["textcraft"], 6) for k in (1, 2)] == [0.5, 0.7]
    assert [rows[k]["epochs"] for k in (1, 2)] == [2, 1]
    assert [k.epochs for k in handed] == [2, 1] and all(type(k.epochs) is int for k in handed)
    manifests = [json.loads((root / f"iter_{k}" / "data" / "good" / "textcraft_good.manifest.json").read_text())
                 for k in (1, 2)]
    assert [m["config"]["alpha"] for m in manifests] == [0.5, 0.7]


def test_a_search_left_with_only_taught_tasks_stops_with_one_line(base_model, textcraft_server, tmp_path):
    model = taught_model(base_model, tmp_path, policy=[1, 2, 3], verifier=[4])
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": model}
    runs = tmp_path / "runs"
    with pytest.raises(UsageError) as exc:
        run(settings_for(env, FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(runs)]))
    msg = str(exc.value)
    assert "all 4 textcraft train tasks chosen for the search are tasks MODEL_DIR" in msg and "\n" not in msg
    assert not runs.exists()   # nothing was started

    (Path(model) / "training_tasks.json").write_text('{"task": "textcraft", "policy": 3}')
    with pytest.raises(UsageError, match="training_tasks.json is unreadable"):
        run(settings_for(env, FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(runs)]))


def test_general_data_is_the_models_own_conversations_mixed_at_eta(base_model, textcraft_server, tmp_path):
    """GENERAL_DATA in this project's own format (what the base model was
    trained on, as JSON Lines, two files) reaches the CPU trainer through the
    loop, and round(ETA x agent samples) of it is mixed in."""
    conversation = lambda i: {"messages": [  # noqa: E731
        {"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": f"Goal {i}"},
        {"role": "assistant", "content": "Ok.", "loss": False}, {"role": "user", "content": "obs"},
        {"role": "assistant", "content": f"Thought: t\nAction: get {i} oak log", "loss": True}]}
    files = [tmp_path / "policy.jsonl", tmp_path / "verifier.jsonl"]
    files[0].write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(3)))
    files[1].write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(3, 5)))
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "VARIANTS": "good", "ITERATIONS": "1",
           "GENERAL_DATA": ",".join(map(str, files)), "ETA": "0.5"}
    result = run(settings_for(env, FLAGS + ["--revise_limit", "0", "--eval_limit", "1", "--env_server_base",
                                            textcraft_server, "--runs_dir", str(tmp_path), "--name", "general"]))
    assert result.exit_code == 0, result.incomplete
    train = result.rows[1]["train"]
    assert train["trainer"] == "cpu" and train["agent_samples"] == result.rows[1]["data"]["train_samples"] > 0
    assert train["general_samples"] == round(0.5 * train["agent_samples"])
    assert train["epochs"] == 1 and train["lr"] == 1e-3   # SMALL's EPOCHS and LR


# --------------------------------------------------------------------------- baselines in iteration 1 only

def test_variant_iterations_stop_the_named_variants_early():
    s = parse(IterateSettings, [], {"VARIANTS": "agent-r,direct,good,eto", "ITERATIONS": "3",
                                    "VARIANT_ITERATIONS": "good=1, eto=2"})
    s.finish()
    assert [s.variants_at(k) for k in (1, 2, 3)] == [["agent-r", "direct", "good", "eto"],
                                                      ["agent-r", "direct", "eto"], ["agent-r", "direct"]]
    unset = parse(IterateSettings, [], {"VARIANTS": "agent-r,good", "ITERATIONS": "2"})
    unset.finish()
    assert unset.variants_at(2) == ["agent-r", "good"]
    one = parse(IterateSettings, [], {"VARIANTS": "agent-r", "ITERATIONS": "2", "VARIANT_ITERATIONS": "good=1"})
    one.finish()                               # what reproduce_paper.sh's per-variant runs see
    assert one.variants_at(2) == ["agent-r"]
    assert manifest_config(s)["variant_iterations"] == "good=1, eto=2"


def test_variants_run_and_tabulate_in_one_order_whatever_the_command_lists():
    """reproduce_paper.sh rewrites a run's table from commands of different
    VARIANTS (each variant's pieces on machines of their own); the rows keep
    their places, and a variant listed twice runs once."""
    s = parse(IterateSettings, [], {"VARIANTS": "eto,direct,agent-r,direct", "ITERATIONS": "1"})
    s.finish()
    assert s.variant_list == s.variants_at(1) == ["agent-r", "direct", "eto"]


@pytest.mark.parametrize("value", ["good", "good=x", "best=1", "good=-1"])
def test_a_bad_variant_iterations_is_one_clear_line(value):
    with pytest.raises(UsageError) as exc:
        parse(IterateSettings, [], {"VARIANTS": "agent-r,good", "VARIANT_ITERATIONS": value}).finish()
    assert "VARIANT_ITERATIONS" in str(exc.value) and "variant=N" in str(exc.value) and "\n" not in str(exc.value)


def test_the_loop_runs_a_stopped_variant_only_up_to_its_iteration(small_env, textcraft_server, tmp_path, monkeypatch):
    """The runner asks for no row past a variant's last iteration, and its
    progress bar counts only the stages that will run."""
    from agent_r.loop import runner

    played, totals = [], []
    monkeypatch.setattr(runner.Loop, "base_row", lambda self: None)
    monkeypatch.setattr(runner.Loop, "iteration_row", lambda self, k, v: played.append((k, v)))
    monkeypatch.setattr(runner, "write_results", lambda *a, **k: None)
    real_tqdm = runner.tqdm
    monkeypatch.setattr(runner, "tqdm", lambda total, unit: totals.append(total) or real_tqdm(total=total, unit=unit))
    env = {**small_env, "VARIANTS": "agent-r,good", "ITERATIONS": "2", "VARIANT_ITERATIONS": "good=1"}
    run(settings_for(env, FLAGS + ["--name", "stopped", "--runs_dir", str(tmp_path), "--env_server_base",
                                   textcraft_server]))
    assert played == [(1, "agent-r"), (1, "good"), (2, "agent-r")]
    assert totals == [1 + 3 * runner.STAGES_PER_ITERATION]
