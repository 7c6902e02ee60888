"""The instruction prompt a client opens each conversation with: the bundled
one per environment, or the user's file (AGENTENV_INSTRUCTION_FILE)."""
from __future__ import annotations

import pytest

from agent_r.envs import get_env
from agent_r.search import SearchSettings
from agent_r.settings import parse
from agentenv_client import EnvClientUsageError, TextCraftEnvClient


def test_conversation_start_and_instruction_override(textcraft_server, tmp_path, monkeypatch):
    """The conversation starts with the bundled instruction and "Ok."; an
    instruction file replaces it, also through AGENTENV_INSTRUCTION_FILE and
    the environment's EnvSpec; a missing file is named."""
    with TextCraftEnvClient(textcraft_server, 544) as env:
        human, gpt = env.conversation_start
        assert human == {"from": "human", "loss": None, "value": env.instruction}
        assert gpt == {"from": "gpt", "loss": False, "value": "Ok."}
        assert "Thought:" in env.instruction and "Action:" in env.instruction and "craft" in env.instruction
    custom = tmp_path / "prompt.txt"
    custom.write_text("My own TextCraft prompt.\n")
    with TextCraftEnvClient(textcraft_server, 544, instruction_file=str(custom)) as env:
        assert env.instruction == "My own TextCraft prompt."
    # scripts take the file from AGENTENV_INSTRUCTION_FILE through their settings
    settings = parse(SearchSettings, [], {"AGENTENV_INSTRUCTION_FILE": str(custom)})
    spec = get_env("textcraft")
    with spec.make_client(textcraft_server, instruction_file=settings.backend.instruction_file) as env:
        assert env.conversation_start[0]["value"] == "My own TextCraft prompt."
    with pytest.raises(EnvClientUsageError, match="missing.txt does not exist"):
        TextCraftEnvClient(textcraft_server, 544, instruction_file=str(tmp_path / "missing.txt"))
