"""The bundled task lists: AgentEval's id lists ship with the paper's sizes and
are the default where their ids mean the paper's tasks; every split argument
reads both list shapes in use; the importer writes exactly the bundled files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r import splits
from agent_r.envs import AGENTGYM, LOCAL, ServerIdentity, get_env, load_split_file
from agent_r.search import SearchSettings, select_tasks
from agent_r.settings import UsageError
from tests.envs.doubles import search_settings

TEXTCRAFT, SCIWORLD, WEBSHOP = get_env("textcraft"), get_env("sciworld"), get_env("webshop")


def test_agenteval_lists_are_bundled_with_the_papers_sizes():
    """TextCraft 100 test / 374 train, SciWorld 200 test (no train list),
    WebShop 200 test / 3,930 train; train and test never share an id; the
    TextCraft test ids are the paper's scattered ones, not "0-99"."""
    tc, sw, ws = (env.split("agenteval") for env in (TEXTCRAFT, SCIWORLD, WEBSHOP))
    assert len(tc.indices("test", "textcraft")) == 100 and len(tc.indices("train", "textcraft")) == 374
    assert len(sw.indices("test", "sciworld")) == 200 and sw.train is None
    assert len(ws.indices("test", "webshop")) == 200 and len(ws.indices("train", "webshop")) == 3930
    for s, env in ((tc, "textcraft"), (ws, "webshop")):
        assert not set(s.indices("train", env)) & set(s.indices("test", env))
    test = tc.indices("test", "textcraft")
    assert test != list(range(100)) and {30, 140, 180, 420, 444, 535} <= set(test)   # not "indices 0-99"
    assert all(0 <= i < 4639 for i in sw.indices("test", "sciworld"))


def test_default_split_follows_the_server_in_use():
    """AgentGym's TextCraft server defaults to the paper's lists, ours to the
    project's; SciWorld and WebShop default to the paper's everywhere; an
    unknown --split name fails, naming the choices, before any server is asked."""
    agentgym = ServerIdentity(AGENTGYM)
    assert TEXTCRAFT.default_split(agentgym).name == "agenteval"   # the paper's ids mean the paper's goals there
    assert TEXTCRAFT.default_split(LOCAL).name == "project"        # ours orders equal-depth goals by id
    assert SCIWORLD.default_split(agentgym).name == SCIWORLD.default_split(LOCAL).name == "agenteval"
    assert WEBSHOP.default_split(agentgym).name == "agenteval"
    assert WEBSHOP.split_indices("test", server=agentgym) == WEBSHOP.split("agenteval").indices("test", "webshop")
    with pytest.raises(UsageError, match="--split='paper' is not a textcraft split; choose one of: agenteval, project"):
        TEXTCRAFT.split("paper")
    nowhere = "http://127.0.0.1:9"                                # a bad name fails before any server is asked
    with pytest.raises(UsageError, match="--split='project' is not a webshop split; choose one of: agenteval"):
        WEBSHOP.split_indices("test", split="project", server=nowhere)
    with pytest.raises(UsageError, match="--split='paper' is not a textcraft split"):
        TEXTCRAFT.search_indices(search_settings(split="paper"), nowhere)


def test_importer_writes_ids_only_from_the_releases_file_shapes(tmp_path):
    """``python -m agent_r.splits agenteval`` reads the Agent-R release's
    files (train as {"<id>": n}, test as item_id lists) and writes files
    byte-identical to the bundled ones."""
    release, out = tmp_path / "mcts_utils", tmp_path / "out"
    out.mkdir()
    for name, (task, source) in splits.AGENTEVAL_FILES.items():
        ids = load_split_file(str(splits.SPLIT_DIR / name))
        path = release / source
        path.parent.mkdir(parents=True, exist_ok=True)
        shape = {str(i): 5 for i in ids} if "train" in name else [{"item_id": f"{task}_{i}"} for i in ids]
        path.write_text(json.dumps(shape, indent=4))
    counts = splits.import_agenteval(release, out)
    assert counts == {"textcraft_agenteval_train.json": 374, "textcraft_agenteval_test.json": 100,
                      "sciworld_agenteval_test.json": 200, "webshop_agenteval_train.json": 3930,
                      "webshop_agenteval_test.json": 200}
    for name in counts:
        assert (out / name).read_bytes() == (splits.SPLIT_DIR / name).read_bytes()


def test_every_split_argument_accepts_the_releases_object_shape(tmp_path, textcraft_server):
    """A {"<idx>": n} object gives its keys in file order, deduplicated, for
    eval's and search's --split_file alike; any other shape is one clear error."""
    as_object = tmp_path / "webshop_train_clean.json"
    as_object.write_text(json.dumps({"31": 7, "8": 6, "31 ": 1, "40": 4}))
    assert load_split_file(str(as_object)) == [31, 8, 40]
    assert TEXTCRAFT.split_indices("test", str(as_object)) == [31, 8, 40]          # eval's --split_file
    settings = SearchSettings(task="textcraft", split_file=str(as_object))          # search's --split_file
    assert select_tasks(TEXTCRAFT, settings, textcraft_server) == [31, 8]            # 40 is a project test task
    bad = tmp_path / "bad.json"
    bad.write_text('"textcraft_1"')
    with pytest.raises(UsageError, match='must be a JSON list of {"item_id": "<task>_<idx>"} or an object'):
        load_split_file(str(bad))


def test_splits_docs_match_the_lists():
    """The splits module's description of the TextCraft test ids is the
    bundled list's, and the file holds one item_id per task."""
    doc = splits.__doc__ or ""
    assert "0-30, 140-180, 420-444 and 533-535" in doc
    assert Path(splits.SPLIT_DIR / "textcraft_agenteval_test.json").read_text().count("item_id") == 100
