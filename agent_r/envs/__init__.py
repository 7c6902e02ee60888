"""Everything that differs between environments lives in ``agent_r/envs``:
one file per environment (textcraft.py, sciworld.py, webshop.py) holding its
``EnvSpec`` (server, client, score scale, splits, search depth, revision
thresholds, action mapping, history format). Search, revision and evaluation
are shared and ask the spec. Adding an environment = one file here + a client
in ``agentenv_client`` + one line in ``ENVS`` below.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent_r.settings import UsageError

SPLIT_DIR = Path(__file__).resolve().parents[1] / "splits"


@dataclass(frozen=True)
class StepScore:
    score: float      # what the node / episode records (0 for a disaster)
    disaster: bool    # negative reward: the episode failed irrecoverably


@dataclass(frozen=True)
class EnvSpec:
    name: str
    default_server: str
    data_len: int
    client_class: Callable[..., Any]
    train_split: str | None      # file name under agent_r/splits, None = user must supply
    test_split: str | None
    max_score: float             # score of a fully solved task (1 or 100)
    max_depth: int               # default MAX_DEPTH: about the steps a solved episode needs
    alpha: float                 # default ALPHA: a good path's leaf must score above it
    beta: float                  # default BETA: a pair's score gap must exceed it

    def make_client(self, env_server_base: str | None = None, instruction_file: str | None = None, **kwargs):
        return self.client_class(env_server_base=env_server_base or self.default_server, data_len=self.data_len,
                                 instruction_file=instruction_file, **kwargs)

    def prepare_action(self, client, action: str) -> str:
        """The action actually stepped (clients clean their own text)."""
        return action

    def history_entry(self, action: str, observation: str) -> Any:
        """One item of a node's ``recent_actions``."""
        return [action, observation]

    def step_score(self, reward: float) -> StepScore:
        if reward < 0:
            return StepScore(0.0, True)
        return StepScore(float(reward), False)

    def is_success(self, score: float) -> bool:
        return score >= self.max_score

    def search_indices(self, settings: Any, server: str) -> tuple[list[int], str]:
        """(train task indices a search covers, a phrase saying how they were
        chosen). Index slicing by --min/--max over the train split."""
        train = self.split_indices("train", settings.split_file)
        hi = settings.max if settings.max is not None else float("inf")
        chosen = [i for i in train if settings.min <= i < hi]
        end = settings.max if settings.max is not None else "end"
        return chosen, f"indices in [{settings.min}, {end}) of the {len(train)} train tasks"

    def split_indices(self, which: str, split_file: str | None = None) -> list[int]:
        """Task indices of the train or test split: from ``split_file`` when
        given, else the project's bundled list."""
        bundled = self.train_split if which == "train" else self.test_split
        if split_file is None:
            if bundled is None:
                raise UsageError(
                    f"TASK={self.name} has no bundled {which} split: pass --split_file with an AgentGym "
                    f"task list (a JSON list of {{\"item_id\": \"{self.name}_<idx>\"}}); see README 'WebShop'."
                )
            split_file = str(SPLIT_DIR / bundled)
        return load_split_file(split_file)


def load_split_file(path: str) -> list[int]:
    """An AgentGym task list: a JSON list of {"item_id": "<task>_<idx>"} (plain
    integers are accepted too). Returns the indices in file order, deduplicated."""
    if not os.path.exists(path):
        raise UsageError(f"split file {path} does not exist; pass --split_file with an AgentGym task list")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise UsageError(f"split file {path} is not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise UsageError(f"split file {path} must be a JSON list of {{\"item_id\": \"<task>_<idx>\"}}")
    out: list[int] = []
    seen: set[int] = set()
    for i, item in enumerate(data):
        if isinstance(item, int) and not isinstance(item, bool):
            idx = item
        elif isinstance(item, dict) and isinstance(item.get("item_id"), str):
            tail = item["item_id"].rsplit("_", 1)[-1]
            if not tail.isdigit():
                raise UsageError(f"split file {path}, entry {i}: item_id {item['item_id']!r} does not end in _<index>")
            idx = int(tail)
        else:
            raise UsageError(
                f"split file {path}, entry {i}: expected {{\"item_id\": \"<task>_<idx>\"}}, got {item!r}"
            )
        if idx not in seen:
            seen.add(idx)
            out.append(idx)
    return out


def _registry() -> dict[str, EnvSpec]:
    from agent_r.envs.sciworld import SCIWORLD
    from agent_r.envs.textcraft import TEXTCRAFT
    from agent_r.envs.webshop import WEBSHOP

    return {spec.name: spec for spec in (TEXTCRAFT, SCIWORLD, WEBSHOP)}


ENVS: dict[str, EnvSpec] = {}


def get_env(task: str) -> EnvSpec:
    if not ENVS:
        ENVS.update(_registry())
    key = task.strip().lower()
    if key not in ENVS:
        raise UsageError(f"unknown TASK={task!r}; choose one of: {', '.join(sorted(ENVS))}")
    return ENVS[key]
