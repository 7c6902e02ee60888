"""Which server is in use: ours say so at GET /identity, AgentGym's cannot; a
server of another environment or another task count is refused, and a split
made for another kind of server is used with a warning."""
from __future__ import annotations

import logging

import pytest
import requests

from agent_r.envs import AGENT_R, AGENTGYM, ServerIdentity, get_env, identify_server
from agent_r.settings import UsageError
from tests.envs.doubles import search_settings

TEXTCRAFT, SCIWORLD = get_env("textcraft"), get_env("sciworld")


def test_servers_are_identified(textcraft_server, fake_server):
    """Our TextCraft server names itself, its task count and order; a server
    without /identity is AgentGym's; ours asked for TASK=sciworld is refused."""
    ours = requests.get(f"{textcraft_server}/identity").json()
    assert ours == {"server": "agent-r", "env": "textcraft", "tasks": 544,
                    "task_order": "goals by recipe depth, then item id"}
    assert identify_server(textcraft_server, TEXTCRAFT) == ServerIdentity(AGENT_R, "textcraft", 544, textcraft_server)
    upstream = fake_server()
    assert identify_server(upstream, TEXTCRAFT).kind == AGENTGYM
    with pytest.raises(UsageError, match=f"the env server at {textcraft_server} serves textcraft, not TASK=sciworld"):
        identify_server(textcraft_server, SCIWORLD)


def test_a_server_with_another_task_count_is_refused(fake_server):
    """A split's ids would name other tasks on a server with another task
    count: the search refuses, naming both counts and the server."""
    url = fake_server({"server": "agent-r", "env": "textcraft", "tasks": 100})
    with pytest.raises(UsageError, match="split 'project' of textcraft indexes 544 tasks but the agent-r textcraft "
                                         f"server at {url} serves 100"):
        TEXTCRAFT.search_indices(search_settings(), url)


def test_a_split_made_for_another_server_warns(fake_server, caplog):
    """The project split on AgentGym's server logs a warning; that server's
    default split does not."""
    url = fake_server()
    with caplog.at_level(logging.WARNING, logger="agent_r.envs"):
        TEXTCRAFT.split_indices("test", split="project", server=url)
    assert "split 'project'" in caplog.text and "was made for agent-r servers" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent_r.envs"):
        TEXTCRAFT.split_indices("test", server=url)                  # the default there: no warning
    assert caplog.text == ""
