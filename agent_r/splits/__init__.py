"""The bundled task splits and the rules that made them.

Regenerate with ``python -m agent_r.splits`` (SciWorld needs Java; it starts one
ScienceWorld JVM). Files are AgentGym task lists: ``[{"item_id": "<task>_<idx>"}]``.

TextCraft (our deterministic server: 544 goals, indices 0-543, sorted by recipe
depth ascending). The reference's test list was indices 0-99 on AgentGym's
server, whose index -> goal mapping depended on directory order; on ours, 0-99
would be only the shallowest goals. Rule: **test = every index i < 500 with
i % 5 == 0 (100 tasks, spread over all depths); train = the other 444.**

SciWorld. The reference's training task numbers (tasks.SCIWORLD_TRAIN_TASK_NUMS,
positions in ScienceWorld's alphabetical task-name list) are exactly the 23
task types AgentGym serves: the other 7 positions are the task keys 5-1, 5-2,
9-1, 9-2, 9-3, 10-1, 10-2 that AgentGym's server excludes, so no held-out task
*type* can be served. The split is therefore by variation: search uses the
variations at positions 1..--task_iteration of each type (as the reference
did), and **test = for each of the 23 served task types, the first 10 of
ScienceWorld's own test variations (``get_variations_test()``), as global
indices in AgentGym's game order** (agentenv_client.sciworld.build_game_list).
ScienceWorld's test variations lie after its train/dev variations, so they
never meet the search positions; mcts_collection.py also drops any test index
from the search set.

WebShop has no bundled split: its product data cannot be shipped; pass the
AgentGym lists with --split_file.
"""
from __future__ import annotations

from pathlib import Path

SPLIT_DIR = Path(__file__).resolve().parent
TEXTCRAFT_GOALS = 544
TEXTCRAFT_TEST_BELOW = 500
TEXTCRAFT_TEST_EVERY = 5
SCIWORLD_TEST_PER_TASK = 10


def textcraft_split() -> tuple[list[int], list[int]]:
    """(train, test) task indices of TextCraft."""
    test = [i for i in range(TEXTCRAFT_TEST_BELOW) if i % TEXTCRAFT_TEST_EVERY == 0]
    held_out = set(test)
    return [i for i in range(TEXTCRAFT_GOALS) if i not in held_out], test


def sciworld_test_split(per_task: int = SCIWORLD_TEST_PER_TASK) -> list[int]:
    """Global indices of SciWorld's test list (rule in the module docstring).
    Starts a ScienceWorld JVM."""
    from scienceworld import ScienceWorldEnv

    from agentenv_client.sciworld import build_game_list

    games = build_game_list()
    where = {game: i for i, game in enumerate(games)}
    env = ScienceWorldEnv()
    try:
        out: list[int] = []
        for name in dict.fromkeys(name for name, _ in games):  # task types in game order
            env.load(name, 0)
            variations = sorted(env.get_variations_test())[:per_task]
            out.extend(where[(name, v)] for v in variations)
        return out
    finally:
        env.close()


def as_agentgym(task: str, indices: list[int]) -> list[dict[str, str]]:
    return [{"item_id": f"{task}_{i}"} for i in indices]


def main() -> None:
    from agent_r.io import atomic_write_json

    train, test = textcraft_split()
    atomic_write_json(SPLIT_DIR / "textcraft_train.json", as_agentgym("textcraft", train), indent=1)
    atomic_write_json(SPLIT_DIR / "textcraft_test.json", as_agentgym("textcraft", test), indent=1)
    atomic_write_json(SPLIT_DIR / "sciworld_test.json", as_agentgym("sciworld", sciworld_test_split()), indent=1)
    print(f"wrote textcraft train {len(train)}, test {len(test)}; sciworld test to {SPLIT_DIR}")
