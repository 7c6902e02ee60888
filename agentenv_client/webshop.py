"""Client for AgentGym's WebShop server (agentenv-webshop). It needs WebShop's
product data and search index, so no local server ships with this project."""
from __future__ import annotations

from agentenv_client.base import BaseEnvClient, EnvServerError, StepOutput


class WebshopEnvClient(BaseEnvClient):
    env_name = "webshop"
    id_key = "env_idx"
    start_hint = "AgentGym's agentenv-webshop server (`webshop --host 127.0.0.1 --port 36003`, see docs/environments.md)"

    def _create(self) -> int:
        env_id = self._post("create", {})
        if isinstance(env_id, bool) or not isinstance(env_id, int):
            raise self._bad("create", f"expected an integer env id, got {str(env_id)[:200]}")
        return env_id

    def _post(self, endpoint: str, data: dict, retries: int | None = None):
        if endpoint == "create":   # AgentGym's WebShop /create takes no body
            return self._request("POST", "create", retries=retries)
        return super()._post(endpoint, data, retries)

    def _bad(self, endpoint: str, what: str) -> EnvServerError:
        return EnvServerError(f"webshop server {self.env_server_base}, /{endpoint}, env id {self.env_id}: {what}",
                              endpoint, self.env_id)

    def observe(self) -> str:
        obs = self._get("observation")
        if not isinstance(obs, str):
            raise self._bad("observation", f"expected a string, got {str(obs)[:200]}")
        return obs

    def reset(self, idx: int):
        payload = self._post("reset", {"session_id": int(idx)})
        self.info = {"observation": self.observe(), "reward": 0, "done": False}
        return payload

    def _took_step(self, action: str, payload) -> StepOutput:
        out = StepOutput(state=self._field(payload, "state", "step"),
                         reward=float(self._field(payload, "reward", "step")),
                         done=bool(self._field(payload, "done", "step")))
        self.info = {"observation": out.state, "reward": out.reward, "done": out.done,
                     "info": payload.get("info")}
        return out
