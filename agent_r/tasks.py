"""Everything that differs between TextCraft, SciWorld and WebShop, in one place.

The search, revision and evaluation code is shared; it asks a ``TaskRules``
object how to build a client, how to prepare an action before stepping, how to
read a step's score, and which task indices form the train and test splits.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from agent_r.config import UsageError

SPLIT_DIR = Path(__file__).resolve().parent / "splits"

# ScienceWorld task numbers (positions in its task-name list) used for training
# (SPEC section 3). The other 7 positions are the task types AgentGym's server
# excludes, so the test split is by variation (see agent_r/splits).
SCIWORLD_TRAIN_TASK_NUMS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 18, 19, 20, 21, 22, 25, 26, 27, 28, 29)
# The order in which the reference's mcts_collection.py walked them (--min/--max
# slice this list for SciWorld).
SCIWORLD_SEARCH_ORDER = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 18, 19, 20, 21, 22, 25, 26, 27, 28, 29, 0)


@dataclass(frozen=True)
class StepScore:
    score: float      # what the node / episode records (0 for a disaster)
    disaster: bool    # negative reward: the episode failed irrecoverably


@dataclass(frozen=True)
class TaskRules:
    name: str
    default_server: str
    data_len: int
    train_split: str | None      # file name under agent_r/splits, None = user must supply
    test_split: str | None
    max_score: float             # score of a fully solved task (1 or 100)

    def client_class(self):
        import agentenv_client as ac

        return {"textcraft": ac.TextCraftEnvClient, "sciworld": ac.SciworldEnvClient,
                "webshop": ac.WebshopEnvClient}[self.name]

    def make_client(self, env_server_base: str | None = None, **kwargs):
        return self.client_class()(env_server_base=env_server_base or self.default_server,
                                   data_len=self.data_len, **kwargs)

    def prepare_action(self, client, action: str) -> str:
        """SciWorld maps free text onto the closest valid action before stepping;
        the other clients clean their own actions."""
        if self.name == "sciworld":
            return client.map_to_valid_action(action)
        return action

    def history_entry(self, action: str, observation: str):
        """One item of a node's ``recent_actions``: ``[action, observation]``;
        SciWorld keeps the reference's string form ``"(action, observation)"``."""
        if self.name == "sciworld":
            return f"({action}, {observation})"
        return [action, observation]

    def step_score(self, reward: float) -> StepScore:
        if reward < 0:
            return StepScore(0.0, True)
        return StepScore(float(reward), False)

    def is_success(self, score: float) -> bool:
        return score >= self.max_score

    # ---- splits -------------------------------------------------------
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


def sciworld_train_indices(game_nums: dict, task_nums: Sequence[int], task_iteration: int) -> list[int]:
    """SciWorld search tasks as the reference chose them: for each task number
    (a position in ScienceWorld's task-name list) the global indices at
    positions 1..task_iteration of its variation list (``game_nums`` maps task
    number -> global indices, as the server's /game_nums returns it; position 0
    is skipped, as in the reference). Task numbers the server does not serve
    are an error."""
    nums = {int(k): list(v) for k, v in game_nums.items()}
    out: list[int] = []
    for t in task_nums:
        if not nums.get(t):
            served = sorted(k for k, v in nums.items() if v)
            raise UsageError(
                f"SciWorld task number {t} is not served by the env server (it serves {served}); "
                "pick --task_num from those"
            )
        out.extend(nums[t][1:task_iteration + 1])
    return out


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


TASKS: dict[str, TaskRules] = {
    "textcraft": TaskRules("textcraft", "http://127.0.0.1:36001", 544, "textcraft_train.json", "textcraft_test.json", 1.0),
    "sciworld": TaskRules("sciworld", "http://127.0.0.1:36002", 4639, None, "sciworld_test.json", 100.0),
    "webshop": TaskRules("webshop", "http://127.0.0.1:36003", 12087, None, None, 1.0),
}


def get_rules(task: str) -> TaskRules:
    key = task.strip().lower()
    if key not in TASKS:
        raise UsageError(f"unknown TASK={task!r}; choose one of: {', '.join(sorted(TASKS))}")
    return TASKS[key]
