"""Client for a TextCraft server (ours: ``python -m agentenv_servers.textcraft``,
or AgentGym's agentenv-textcraft)."""
from __future__ import annotations

import re

from agentenv_client.base import BaseEnvClient, StepOutput

_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9, ]+")


def clean_action(action: str) -> str:
    """TextCraft only understands letters, digits, commas and single spaces."""
    return " ".join(_NOT_ALLOWED.sub("", " ".join(action.split())).split())


class TextCraftEnvClient(BaseEnvClient):
    env_name = "textcraft"
    start_hint = "`python -m agentenv_servers.textcraft --port 36001`"

    def _create(self) -> int:
        payload = self._post("create", {"commands": None, "goal": None})
        self.info = {"observation": self._field(payload, "observation", "create"), "reward": 0, "done": False}
        return self._field(payload, "id", "create")

    def reset(self, idx: int) -> dict:
        payload = self._post("reset", {"data_idx": int(idx)})
        self.info = {"observation": self._field(payload, "observation", "reset"), "reward": 0, "done": False}
        return payload

    def _wire_action(self, action: str) -> str:
        return clean_action(action)

    def _took_step(self, action: str, payload) -> StepOutput:
        out = StepOutput(state=self._field(payload, "observation", "step"),
                         reward=float(self._field(payload, "reward", "step")),
                         done=bool(self._field(payload, "done", "step")))
        self.info = {"observation": out.state, "reward": out.reward, "done": out.done}
        return out
