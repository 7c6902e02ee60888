"""Everything that differs between environments lives in ``agent_r/envs``:
one file per environment (textcraft.py, sciworld.py, webshop.py) holding its
``EnvSpec``; the base class and the rules every environment shares (splits,
server identification, task-list files) are in spec.py. Search, revision and
evaluation are shared and ask the environment's ``EnvSpec``.

Adding an environment = one file here + a client in ``agentenv_client`` + one
entry in ``ENVS`` below. Imports run one way: the per-environment files import
spec.py, this file imports them; ``from agent_r.envs import X`` keeps working
for every public name.
"""
from __future__ import annotations

from agent_r.envs.sciworld import SCIWORLD
from agent_r.envs.spec import (AGENT_R, AGENTGYM, LOCAL, SPLIT_DIR, EnvSpec, ServerIdentity, Split, StepScore,
                               identify_server, load_split_file)
from agent_r.envs.textcraft import TEXTCRAFT
from agent_r.envs.webshop import WEBSHOP
from agent_r.settings import UsageError

__all__ = ["AGENT_R", "AGENTGYM", "ENVS", "LOCAL", "SCIWORLD", "SPLIT_DIR", "TEXTCRAFT", "WEBSHOP", "EnvSpec",
           "ServerIdentity", "Split", "StepScore", "get_env", "identify_server", "load_split_file"]

ENVS: dict[str, EnvSpec] = {spec.name: spec for spec in (TEXTCRAFT, SCIWORLD, WEBSHOP)}


def get_env(task: str) -> EnvSpec:
    """The ``EnvSpec`` for ``TASK`` (case and surrounding spaces ignored); an
    unknown name is a usage error listing the known ones."""
    key = task.strip().lower()
    if key not in ENVS:
        raise UsageError(f"unknown TASK={task!r}; choose one of: {', '.join(sorted(ENVS))}")
    return ENVS[key]
