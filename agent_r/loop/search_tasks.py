"""Which train tasks the loop searches: never one the base model was taught.

In the paper the base model is a general LLM that never saw expert data of
the tasks its search explores; the search then finds paths the model could
not produce, and self-training has something to teach. A small model trained
on expert trajectories of the very tasks the loop searches has nothing to
learn from them (bench/RESULTS.md, "Self-training reproduction"). So a base
model folder may list the train tasks it was trained on in
``training_tasks.json`` (``{"task": "textcraft", "split": "train", "policy":
[...], "verifier": [...]}``, written by scripts/train_tiny_model.py), and the
loop leaves those tasks out of every search: it logs how many it dropped,
searches the rest through a task list in the run folder, and stops with one
line only when nothing would be left.

``pick`` chooses N of the other train tasks spread over the recipe depths
(seeded): what reproduction/reproduce_paper.sh searches.

    python -m agent_r.loop.search_tasks --model_dir models/textcraft-base --n 200 --out tasks.json
"""
from __future__ import annotations

import argparse
import json
import logging
import random
from pathlib import Path
from typing import Callable, Optional

from agent_r.envs import get_env
from agent_r.io import atomic_write_text
from agent_r.settings import UsageError, run_cli, setup_logging

log = logging.getLogger(__name__)

TRAINING_TASKS_FILE = "training_tasks.json"
ROLES = ("policy", "verifier")


def taught_tasks(model_dir: str | Path) -> Optional[tuple[str, set[int]]]:
    """(environment, the train tasks any of the model's training rows came
    from) of a model folder's training_tasks.json; None without one."""
    path = Path(model_dir) / TRAINING_TASKS_FILE
    if not path.is_file():
        return None
    fix = (f'it must be {{"task": "<env>", "policy": [task indices], "verifier": [task indices]}} '
           f"(scripts/train_tiny_model.py writes it); fix or remove {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        task = get_env(str(data["task"])).name
        lists = [data.get(role, []) for role in ROLES]
        indices = {int(i) for lst in lists for i in lst}
        if not all(isinstance(lst, list) for lst in lists):
            raise TypeError("a role is not a list")
    except (ValueError, KeyError, TypeError, AttributeError, UsageError) as exc:
        raise UsageError(f"{path} is unreadable ({type(exc).__name__}: {exc}): {fix}") from None
    return task, indices


def split_file_path(root: Path, task: str) -> Path:
    """The task list the loop writes for a task whose search lost taught tasks."""
    return root / f"search_tasks_{task}.json"


def without_taught(candidates: list[int], taught: set[int], task: str, model_dir: str) -> list[int]:
    """``candidates`` without the taught tasks; a UsageError when none remains."""
    kept = [i for i in candidates if i not in taught]
    if not kept:
        raise UsageError(f"all {len(candidates)} {task} train tasks chosen for the search are tasks MODEL_DIR "
                         f"{model_dir} was trained on ({TRAINING_TASKS_FILE}): choose others with --split_file "
                         "or --min/--max (python -m agent_r.loop.search_tasks writes a list of the others)")
    return kept


def plan_exclusions(model_dir: str, tasks: list[str], candidates: Callable[[str], list[int]]
                    ) -> dict[str, dict]:
    """Per task of the run: the search's tasks without those ``model_dir``
    was taught (``candidates(task)``: the tasks the search would cover);
    only the environment training_tasks.json names is touched."""
    taught = taught_tasks(model_dir)
    if taught is None:
        return {}
    env, indices = taught
    if env not in tasks:
        log.info("%s/%s lists %s tasks; this run searches %s", model_dir, TRAINING_TASKS_FILE, env, ",".join(tasks))
        return {}
    chosen = candidates(env)
    kept = without_taught(chosen, indices, env, model_dir)
    log.info("search of %s: %d of %d chosen train tasks left out, MODEL_DIR was trained on them (%s); %d remain",
             env, len(chosen) - len(kept), len(chosen), TRAINING_TASKS_FILE, len(kept))
    return {env: {"chosen": len(chosen), "taught_left_out": len(chosen) - len(kept), "searched": kept}}


def write_task_list(path: Path, indices: list[int], task: str) -> None:
    """AgentGym's task-list shape, the one --split_file reads everywhere."""
    atomic_write_text(path, json.dumps([{"item_id": f"{task}_{i}"} for i in indices], indent=0) + "\n")


# --------------------------------------------------------------------------- choosing N unseen tasks

def textcraft_depth() -> Callable[[int], int]:
    """Task index -> its goal's recipe depth (the TextCraft game's recipe book)."""
    from agentenv_servers.textcraft_env import load_recipe_book

    book = load_recipe_book()
    return lambda i: book.depth(book.task(i)[0])


def pick(candidates: list[int], n: int, seed: int, stratum: Callable[[int], int] | None = None) -> list[int]:
    """``n`` of ``candidates`` (all when fewer), a seeded sample spread over
    the strata in proportion to their sizes (largest remainders first), in
    index order."""
    if n >= len(candidates):
        return sorted(candidates)
    rng = random.Random(seed)
    groups: dict[int, list[int]] = {}
    for i in sorted(candidates):
        groups.setdefault(stratum(i) if stratum else 0, []).append(i)
    share = {g: n * len(m) / len(candidates) for g, m in groups.items()}
    take = {g: int(s) for g, s in share.items()}
    for g in sorted(groups, key=lambda g: (take[g] - share[g], g))[:n - sum(take.values())]:
        take[g] += 1
    return sorted(i for g, members in sorted(groups.items()) for i in rng.sample(members, take[g]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a task list of N train tasks the model was not trained "
                                     "on, spread over the recipe depths (seeded), for iterate.py --split_file.")
    parser.add_argument("--model_dir", required=True, help="the base model folder (its training_tasks.json)")
    parser.add_argument("--task", default="textcraft", help="the environment (default textcraft)")
    parser.add_argument("--n", type=int, default=200, help="tasks to choose (default 200, the paper's)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--out", required=True, help="the JSON task list to write")
    args = parser.parse_args(argv)
    setup_logging()
    spec = get_env(args.task)
    train = spec.split_indices("train")
    taught = taught_tasks(args.model_dir)
    left = train if taught is None or taught[0] != spec.name else \
        without_taught(train, taught[1], spec.name, args.model_dir)
    if args.n < 1:
        raise UsageError(f"--n {args.n}: choose at least one task")
    chosen = pick(left, args.n, args.seed, textcraft_depth() if spec.name == "textcraft" else None)
    write_task_list(Path(args.out), chosen, spec.name)
    whose = f"{args.model_dir} was not trained on" if taught else f"({args.model_dir} has no {TRAINING_TASKS_FILE})"
    print(f"wrote {len(chosen)} of the {len(left)} {spec.name} train tasks {whose} to {args.out}")
    return 0


if __name__ == "__main__":
    run_cli(main)
