"""The bundled task splits: what each list is and the rules that made it.

Files are AgentGym task lists, one ``{"item_id": "<task>_<idx>"}`` per line;
``load_split_file`` reads that and the other shapes in use (plain integers, the
Agent-R release's ``{"<idx>": n}`` objects) for every ``--split_file``.
Which split is used where, and why, is decided in ``agent_r/envs`` (a Split
names the server kinds its ids were made for); docs/environments.md has the
table.

**agenteval** - the paper's lists. AgentEval's test lists (TextCraft 100,
SciWorld 200, WebShop 200 ids), which the paper evaluates on, and the train
lists the Agent-R release ships with them (TextCraft 374 ids, WebShop 3,930
ids; the release stores these as ``{"<id>": n}`` objects). Only the ids are
bundled, in the release's order (``--limit N`` evaluates its first N):
``python -m agent_r.splits agenteval <Agent-R checkout>/mcts_utils`` rewrites
them. The TextCraft test ids are 0-30, 140-180, 420-444 and 533-535 (not
"0-99"); on AgentGym's server they are goals of those depth ranks, whose
order within a depth follows the directory listing, so no server reproduces
the paper's exact goals. SciWorld ids index AgentGym's game list, which our
server reproduces exactly. WebShop ids index AgentGym's WebShop goals.

**project** - the project's own lists, made for our deterministic TextCraft
server (544 goals, indices 0-543, sorted by recipe depth, then item id) and
kept so that runs made with them (the bundled model's training data) stay
comparable. Rule: **test = every index i < 500 with i % 5 == 0 (100 tasks,
spread over all depths); train = the other 444.** Regenerate with
``python -m agent_r.splits`` (SciWorld needs Java; it starts one JVM).

SciWorld. The reference's training task numbers (positions in ScienceWorld's
alphabetical task-name list) are exactly the 23 task types AgentGym serves:
the other 7 positions are the task keys 5-1, 5-2, 9-1, 9-2, 9-3, 10-1, 10-2
that AgentGym's server excludes, so no held-out task *type* can be served and
both splits hold out variations. The search uses the variations at positions
1..--task_iteration of each type, as the reference did, minus any test id of
the split in use. Project rule: **test = for each of the 23 served task
types, the first 10 of ScienceWorld's own test variations
(``get_variations_test()``), as global indices in AgentGym's game order**
(agentenv_client.sciworld.build_game_list); they lie after the train/dev
variations and never meet the search positions.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from agent_r.settings import UsageError

SPLIT_DIR = Path(__file__).resolve().parent
TEXTCRAFT_GOALS = 544
TEXTCRAFT_TEST_BELOW = 500
TEXTCRAFT_TEST_EVERY = 5
SCIWORLD_TEST_PER_TASK = 10

# bundled file -> (task, the file it is read from in the Agent-R release's mcts_utils folder)
AGENTEVAL_FILES = {
    "textcraft_agenteval_train.json": ("textcraft", "textcraft/textcraft_train_clean.json"),
    "textcraft_agenteval_test.json": ("textcraft", "textcraft/textcraft_test.json"),
    "sciworld_agenteval_test.json": ("sciworld", "sciworld/sciworld_test.json"),
    "webshop_agenteval_train.json": ("webshop", "webshop/webshop_train_clean.json"),
    "webshop_agenteval_test.json": ("webshop", "webshop/webshop_test.json"),
}


def textcraft_split() -> tuple[list[int], list[int]]:
    """(train, test) task indices of TextCraft's project split."""
    test = [i for i in range(TEXTCRAFT_TEST_BELOW) if i % TEXTCRAFT_TEST_EVERY == 0]
    held_out = set(test)
    return [i for i in range(TEXTCRAFT_GOALS) if i not in held_out], test


def sciworld_test_split(per_task: int = SCIWORLD_TEST_PER_TASK) -> list[int]:
    """Global indices of SciWorld's project test list (rule in the module
    docstring). Starts a ScienceWorld JVM."""
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


def task_list_text(task: str, indices: list[int]) -> str:
    """Our file format: an AgentGym task list, one entry per line."""
    return "[\n" + ",\n".join(f'{{"item_id": "{task}_{i}"}}' for i in indices) + "\n]\n"


def write_task_list(path: Path, task: str, indices: list[int]) -> None:
    from agent_r.io import atomic_write_text

    atomic_write_text(path, task_list_text(task, indices))


def import_agenteval(release_dir: str | Path, out_dir: Path = SPLIT_DIR) -> dict[str, int]:
    """Write the agenteval files from the Agent-R release's ``mcts_utils``
    folder: the ids only, in the release's order. Returns file -> id count."""
    counts = {}
    for name, (task, source) in AGENTEVAL_FILES.items():
        ids = load_split_file(str(Path(release_dir) / source))
        write_task_list(out_dir / name, task, ids)
        counts[name] = len(ids)
    return counts


def load_split_file(path: str) -> list[int]:
    """A task list in any of the shapes in use: AgentGym's JSON list of
    {"item_id": "<task>_<idx>"}, a list of plain integers, or the Agent-R
    release's train files, a JSON object {"<idx>": n} (its keys are the ids).
    Returns the indices in file order, deduplicated."""
    if not os.path.exists(path):
        raise UsageError(f"split file {path} does not exist; pass --split_file with an AgentGym task list")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise UsageError(f"split file {path} is not valid JSON ({exc})") from None
    shapes = "must be a JSON list of {\"item_id\": \"<task>_<idx>\"} or an object {\"<idx>\": n}"
    if isinstance(data, dict):
        bad = next((k for k in data if _id_text(k) is None), None)
        if bad is not None:
            raise UsageError(f"split file {path} {shapes}; key {bad!r} is not a task index")
        data = [_id_text(k) for k in data]
    if not isinstance(data, list):
        raise UsageError(f"split file {path} {shapes}")
    out: dict[int, None] = {}
    for i, item in enumerate(data):
        out.setdefault(_split_entry(path, i, item))
    return list(out)


def _id_text(text: str) -> int | None:
    """The index in "12" or "<task>_12"; None for anything else."""
    tail = text.strip().rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _split_entry(path: str, i: int, item: Any) -> int:
    if isinstance(item, int) and not isinstance(item, bool):
        return item
    if isinstance(item, dict) and isinstance(item.get("item_id"), str):
        idx = _id_text(item["item_id"])
        if idx is None:
            raise UsageError(f"split file {path}, entry {i}: item_id {item['item_id']!r} does not end in _<index>")
        return idx
    raise UsageError(f"split file {path}, entry {i}: expected {{\"item_id\": \"<task>_<idx>\"}}, got {item!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent_r.splits", description="Regenerate the bundled splits.")
    parser.add_argument("what", nargs="?", choices=("project", "agenteval"), default="project",
                        help="project: the project's rules (default); agenteval: ids from an Agent-R release")
    parser.add_argument("release_dir", nargs="?", help="agenteval: the release's mcts_utils folder")
    args = parser.parse_args(argv)
    if args.what == "agenteval":
        if not args.release_dir:
            parser.error("agenteval needs the Agent-R release's mcts_utils folder")
        for name, n in import_agenteval(args.release_dir).items():
            print(f"wrote {n} ids to {SPLIT_DIR / name}")
        return
    train, test = textcraft_split()
    write_task_list(SPLIT_DIR / "textcraft_train.json", "textcraft", train)
    write_task_list(SPLIT_DIR / "textcraft_test.json", "textcraft", test)
    write_task_list(SPLIT_DIR / "sciworld_test.json", "sciworld", sciworld_test_split())
    print(f"wrote textcraft train {len(train)}, test {len(test)}; sciworld test to {SPLIT_DIR}")
