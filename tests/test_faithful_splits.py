"""The paper's splits (issue 16, items 3 and 5): AgentEval's id lists are
bundled and are the default where their ids mean the paper's tasks; every split
argument takes both list shapes; the server in use is identified; a search
never touches a test task of the split in use, on our servers or AgentGym's."""
from __future__ import annotations

import http.server
import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from agent_r import splits
from agent_r.envs import AGENT_R, AGENTGYM, LOCAL, ServerIdentity, get_env, identify_server, load_split_file
from agent_r.search import SearchSettings, select_tasks
from agent_r.settings import UsageError
from agentenv_client.sciworld import SCIWORLD_TASKS, build_game_list, build_game_nums
from agent_r.envs.sciworld import SCIWORLD_SEARCH_ORDER, sciworld_train_indices

TEXTCRAFT, SCIWORLD, WEBSHOP = get_env("textcraft"), get_env("sciworld"), get_env("webshop")


class _Handler(http.server.BaseHTTPRequestHandler):
    """A server that cannot say what it is, as AgentGym's cannot (404 on
    /identity), or one that answers ``identity``."""

    identity: dict | None = None

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/identity" and self.identity is not None:
            body, status = json.dumps(self.identity).encode(), 200
        elif self.path == "/":
            body, status = b'"This is environment TextCraft."', 200
        else:
            body, status = b'{"detail": "Not Found"}', 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    """start(identity=None) -> URL of a server answering only / and /identity."""
    servers = []

    def start(identity: dict | None = None) -> str:
        handler = type("Handler", (_Handler,), {"identity": identity})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def search_settings(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"split_file": None, "split": None, "min": 0, "max": None, **kw})


# ---------------------------------------------------------------- the bundled lists

def test_agenteval_lists_are_bundled_with_the_papers_sizes():
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


# ---------------------------------------------------------------- both file shapes

def test_every_split_argument_accepts_the_releases_object_shape(tmp_path, textcraft_server):
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


# ---------------------------------------------------------------- identification

def test_servers_are_identified(textcraft_server, fake_server):
    ours = requests.get(f"{textcraft_server}/identity").json()
    assert ours == {"server": "agent-r", "env": "textcraft", "tasks": 544,
                    "task_order": "goals by recipe depth, then item id"}
    assert identify_server(textcraft_server, TEXTCRAFT) == ServerIdentity(AGENT_R, "textcraft", 544, textcraft_server)
    upstream = fake_server()
    assert identify_server(upstream, TEXTCRAFT).kind == AGENTGYM
    with pytest.raises(UsageError, match=f"the env server at {textcraft_server} serves textcraft, not TASK=sciworld"):
        identify_server(textcraft_server, SCIWORLD)


def test_a_server_with_another_task_count_is_refused(fake_server):
    url = fake_server({"server": "agent-r", "env": "textcraft", "tasks": 100})
    with pytest.raises(UsageError, match="split 'project' of textcraft indexes 544 tasks but the agent-r textcraft "
                                         f"server at {url} serves 100"):
        TEXTCRAFT.search_indices(search_settings(), url)


def test_a_split_made_for_another_server_warns(fake_server, caplog):
    url = fake_server()
    with caplog.at_level(logging.WARNING, logger="agent_r.envs"):
        TEXTCRAFT.split_indices("test", split="project", server=url)
    assert "split 'project'" in caplog.text and "was made for agent-r servers" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent_r.envs"):
        TEXTCRAFT.split_indices("test", server=url)                  # the default there: no warning
    assert caplog.text == ""


# ---------------------------------------------------------------- the contamination guard

def test_search_on_agentgyms_textcraft_never_touches_the_papers_test_tasks(fake_server, caplog):
    """The issue's case: pointed at AgentGym's TextCraft server with the
    project's train list, 79 of the 100 AgentEval test ids used to be searched."""
    url = fake_server()
    project_train = str(splits.SPLIT_DIR / "textcraft_train.json")
    paper_test = set(TEXTCRAFT.split("agenteval").indices("test", "textcraft"))
    assert len(paper_test & set(load_split_file(project_train))) == 79
    with caplog.at_level(logging.WARNING):
        chosen = select_tasks(TEXTCRAFT, SearchSettings(task="textcraft", split_file=project_train), url)
    assert len(chosen) == 444 - 79 and not set(chosen) & paper_test
    assert "skipping 79 test task(s) of the 'agenteval' split" in caplog.text
    default, where = TEXTCRAFT.search_indices(search_settings(), url)   # default there: the paper's train list
    assert len(default) == 374 and not set(default) & paper_test and where.endswith("of the 374 train tasks")


def test_search_on_our_textcraft_server_skips_the_project_test_tasks(textcraft_server):
    project_test = set(TEXTCRAFT.split("project").indices("test", "textcraft"))
    chosen, _ = TEXTCRAFT.search_indices(search_settings(split_file=str(splits.SPLIT_DIR /
                                                                         "textcraft_agenteval_test.json")),
                                         textcraft_server)
    assert chosen and not set(chosen) & project_test
    paper = TEXTCRAFT.search_indices(search_settings(split="agenteval"), textcraft_server)[0]
    assert len(paper) == 374


def test_webshop_test_tasks_are_excluded_by_default(fake_server, tmp_path):
    url = fake_server()
    test = WEBSHOP.split("agenteval").indices("test", "webshop")
    chosen, _ = WEBSHOP.search_indices(search_settings(), url)
    assert len(chosen) == 3930 and not set(chosen) & set(test)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps([{"item_id": f"webshop_{i}"} for i in [6, test[0], 8, test[1]]]))
    assert WEBSHOP.search_indices(search_settings(split_file=str(mixed)), url)[0] == [6, 8]


def test_sciworld_search_drops_the_papers_test_variations(sciworld_server):
    games = build_game_list()
    game_nums = build_game_nums(games, sorted(name for _, name, _ in SCIWORLD_TASKS))
    positions = sciworld_train_indices(game_nums, SCIWORLD_SEARCH_ORDER, 5)
    paper_test = set(SCIWORLD.split("agenteval").indices("test", "sciworld"))
    overlap = [i for i in positions if i in paper_test]
    assert len(overlap) == 1                                    # one AgentEval test game sits at position 2
    settings = search_settings(task_num=None, task_iteration=5)
    chosen, where = SCIWORLD.search_indices(settings, sciworld_server)
    assert chosen == [i for i in positions if i not in paper_test] and where.endswith("positions 1..5")
    project = SCIWORLD.search_indices(search_settings(task_num=None, task_iteration=5, split="project"),
                                      sciworld_server)[0]
    assert project == positions                                 # the project's test variations lie further on


def test_splits_docs_match_the_lists():
    doc = splits.__doc__ or ""
    assert "0-30, 140-180, 420-444 and 533-535" in doc
    assert Path(splits.SPLIT_DIR / "textcraft_agenteval_test.json").read_text().count("item_id") == 100
