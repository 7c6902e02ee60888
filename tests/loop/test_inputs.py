"""What the loop is given: bad input stops it with one line before any work,
--split_file chooses the searched tasks (and the test-task guard still holds),
and the search folder a sharded iteration-1 search writes is the one the loop
reads."""
from __future__ import annotations

import json

import pytest

import iterate as iterate_script
from agent_r.loop import IterateSettings
from agent_r.paths import BASE, Layout
from agent_r.loop.models import Policy, policy
from agent_r.loop.stages import search_settings
from agent_r.settings import parse, run_cli
from tests.loop.conftest import ROOT


@pytest.mark.parametrize("env, flags, says", [
    ({"VARIANTS": "agent-r,star"}, [], "unknown variant 'star'"),
    ({"TRAINER": "xtuner", "TRAIN_VENV": "/nonexistent/venv"}, [], "training environment /nonexistent/venv is missing"),
    ({"MODEL_DIR": "/nonexistent/model"}, [], "MODEL_DIR='/nonexistent/model' does not exist"),
    ({"TASK": "minecraft"}, [], "minecraft"),
    ({"TASK": "textcraft,sciworld"}, ["--split_file", "tasks.json"], "--split_file lists the tasks of one"),
], ids=["variant", "trainer_env", "model_dir", "task", "split_file_multi_task"])
def test_bad_input_gets_one_clear_line(env, flags, says, base_model, tmp_path, capsys, monkeypatch):
    for name in ("TASK", "VARIANTS", "TRAINER", "TRAIN_VENV", "MODEL_DIR", "BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL_DIR", base_model)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: iterate_script.main(flags + ["--runs_dir", str(tmp_path), "--env_server_base",
                                                     "http://127.0.0.1:9"]))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert not list(tmp_path.iterdir())   # nothing was started


def test_split_file_reaches_the_search_and_the_guard_still_holds(tmp_path, textcraft_server):
    """--split_file chooses the searched tasks (spread over the split rather
    than its first indices); a test task listed in it is still dropped."""
    from agent_r.envs import get_env

    spec = get_env("textcraft")
    train, test = spec.split_indices("train"), spec.split_indices("test")
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in (train[0], test[0], train[-1])]))
    settings = parse(IterateSettings, ["--split_file", str(split), "--env_server_base", textcraft_server], {})
    ss = search_settings(settings, "textcraft", tmp_path / "trees", Policy("m", "m", settings.backend))
    assert ss.split_file == str(split)
    assert spec.search_indices(ss, textcraft_server)[0] == [train[0], train[-1]]


def test_reproduce_full_shards_write_the_folder_the_loop_reads(tmp_path, textcraft_server):
    """reproduction/reproduce_full.sh searches iteration 1 with mcts_collection.py
    shards beside the base eval. Were their folder not the one iterate.py's
    search stage reads (it names a model's folders by its label), each
    variant would silently search every tree again: the first run of that
    script did, until the shards got ``--model_name base``."""
    import shlex

    from agent_r.search import SearchSettings

    script = (ROOT / "reproduction" / "reproduce_full.sh").read_text()
    command = script[script.index('"$PY" mcts_collection.py'):]
    command = command[:command.index(" > ")].replace("\\\n", " ")
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps([{"item_id": "textcraft_1"}]))
    for var, value in {"$RUNS/$NAME": str(tmp_path / "run"), "$URL": textcraft_server, "$SPLIT": str(split),
                       "$SHARDS": "2", "$i": "0"}.items():
        command = command.replace(var, value)
    env = {"TASK": "textcraft"}
    shard = parse(SearchSettings, shlex.split(command)[2:], env)

    settings = parse(IterateSettings, ["--env_server_base", textcraft_server, "--split_file", str(split)], env)
    base = policy(settings.backend, BASE, shard.backend.model_dir)
    read = search_settings(settings, "textcraft", Layout(tmp_path / "run").trees(1, BASE), base)
    assert shard.out_dir() == read.out_dir()
    assert shard.shard.num_shards == 2
