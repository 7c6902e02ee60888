"""Expert TextCraft trajectories on the TRAIN split, in our conversation format.

Each train task is played by the rule-based expert (agentenv_servers/textcraft_expert.py)
in the in-process game; the conversation is built exactly as the search and
evaluation build it (instruction, "Ok.", observation, then Thought/Action turns
and the cleaned observations). Variants > 0 of a task show the same goal with
another draw of distractor recipes in another order, so the model learns to
read the list instead of memorising positions. Renamed variants go further:
item words are replaced, consistently within the episode, by made-up words
(``oak planks`` -> ``vusk planks``), so a goal's plan cannot be recalled from
its name and must be read off the recipe list; that is what transfers to the
held-out test goals. Made-up words are never words of a real item, so a
renamed task can never be a test task. Test tasks are never used.

    python -m scripts.make_expert_data --out work_dirs/expert/textcraft_train.jsonl --variants 8 --renamed 8

``--tasks base`` plays only the base part of the train split (every third
train task by goal depth, ``base_part``): the tasks models/textcraft-base was
taught, leaving the other two thirds unseen for the self-training loop's
search, as in the paper, where the base model never saw expert data of the
tasks it searches.
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import re

from tqdm import tqdm

from agent_r.conversation import append_turn, initial_conversation
from agent_r.envs import get_env, load_split_file
from agent_r.io import atomic_write_jsonl
from agent_r.settings import UsageError, run_cli, setup_logging
from agentenv_client import load_instruction
from agentenv_servers.textcraft_env import RecipeBook, TextCraftGame, item_text, load_recipe_book
from agentenv_servers.textcraft_expert import Plan, Step, UnsolvableTask, solve

log = logging.getLogger("make_expert_data")

# Words of the game's and the expert's own sentences: never renamed, even where
# an item name contains one ("crafting table"), so the templates stay intact.
TEMPLATE_WORDS = frozenset(
    "a and again anything are base can carrying could craft crafted crafting crafts enough execute find for "
    "format from goal got i inventory is item items minecraft need not now of on so the to using valid "
    "recipe wrong you".split())
_WORD = re.compile(r"[a-z]+")
_ONSETS = ("b", "bl", "br", "d", "dr", "f", "fl", "g", "gr", "k", "kl", "l", "m", "n", "p", "pl", "r", "s",
           "sk", "st", "t", "tr", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "b", "d", "g", "k", "l", "m", "n", "p", "r", "sh", "sk", "t", "x")


def train_indices() -> list[int]:
    """The bundled TextCraft train split (test tasks are never used)."""
    return get_env("textcraft").split_indices("train")


def base_part() -> list[int]:
    """The fixed third of the train split a base model is taught: train tasks
    sorted by goal recipe depth (then index), every third from the first, so
    every depth is represented in proportion. Deterministic: no seed."""
    book = load_recipe_book()
    ranked = sorted(train_indices(), key=lambda i: (book.depth(book.task(i)[0]), i))
    return sorted(ranked[::3])


def select_tasks(spec: str, role: str = "policy") -> list[int]:
    """The task indices of ``--tasks``: ``train`` (the whole train split),
    ``base`` (``base_part``), or a JSON file: a task list (AgentGym's
    [{"item_id": ...}] or plain indices) or a model's training_tasks.json
    (its ``role`` list, "policy" or "verifier"). Test tasks are refused."""
    train = train_indices()
    if spec == "train":
        return train
    if spec == "base":
        return base_part()
    if not spec.endswith(".json"):
        raise UsageError(f"--tasks {spec!r}: use train, base, or a JSON task list file")
    try:
        data = json.loads(open(spec, encoding="utf-8").read())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--tasks {spec}: cannot read it as a JSON task list ({exc})") from None
    if isinstance(data, dict) and role in data:
        indices = list(dict.fromkeys(int(i) for i in data[role]))
    else:
        indices = load_split_file(spec)
    outside = sorted(set(indices) - set(train))
    if outside:
        raise UsageError(f"--tasks {spec}: tasks {outside[:5]} are not train tasks; expert data uses the train "
                         "split only")
    return indices


def variant_game(book: RecipeBook, idx: int, rng: random.Random) -> TextCraftGame:
    """Task ``idx``'s goal with a fresh draw of distractors and a fresh order."""
    goal = book.task(idx)[0]
    return TextCraftGame(idx, book=book, commands="\n".join(book.draw_lines(goal, rng, vary_count=True)), goal=goal)


def real_item_words(book: RecipeBook) -> frozenset[str]:
    return frozenset(w for name in book.items | book.tags for w in item_text(name).split())


def made_up_word(rng: random.Random, avoid: set[str]) -> str:
    """A pronounceable word of 1-2 syllables that is in ``avoid`` (real item
    words, words already used) neither as itself nor as a template word."""
    while True:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 2)))
        word += rng.choice(_CODAS)
        if word not in avoid and word not in TEMPLATE_WORDS:
            avoid.add(word)
            return word


def renaming(book: RecipeBook, game: TextCraftGame, rng: random.Random, share: float = 0.6) -> dict[str, str]:
    """word -> made-up word for about ``share`` of the item words shown in the
    task, always at least one word of the goal (so the goal is a new item)."""
    shown = _WORD.findall(game.commands + " " + item_text(game.goal))
    words = sorted({w for w in shown if w not in TEMPLATE_WORDS})
    goal_words = [w for w in item_text(game.goal).split() if w not in TEMPLATE_WORDS]
    if not goal_words:
        return {}
    chosen = {w for w in words if rng.random() < share} | {rng.choice(goal_words)}
    avoid = set(real_item_words(book))
    return {w: made_up_word(rng, avoid) for w in sorted(chosen)}


def rename_text(text: str, mapping: dict[str, str]) -> str:
    return _WORD.sub(lambda m: mapping.get(m.group(), m.group()), text) if mapping else text


def rename_messages(messages: list[dict], mapping: dict[str, str]) -> list[dict]:
    """The episode with item words renamed after the fixed head (system,
    instruction, "Ok." keep their text)."""
    return [m if i < 3 else dict(m, content=rename_text(m["content"], mapping)) for i, m in enumerate(messages)]


def item_of(action: str) -> str:
    """The item a `get N item` or `craft N item using ...` action is about."""
    return action.split(" using ", 1)[0].split(" ", 2)[2]


def goal_chain_turns(plan: Plan) -> list[str]:
    """The expert's turns with the thought opened by the chain of recipes
    that leads from the goal to the step's item ("acacia boat needs acacia
    planks, acacia planks needs acacia logs."). Each link is copied from the
    goal line or a recipe line, so a small model learns to read the goal and
    follow its recipes instead of recalling plans of goals it has seen."""
    parents: dict[str, str] = {}
    for action in plan.actions:
        if action.startswith("craft "):
            for part in action.split(" using ", 1)[1].split(", "):
                parents.setdefault(part.split(" ", 1)[1], item_of(action))
    turns = []
    for step in plan.steps:
        item, links = item_of(step.action), []
        while item != plan.goal and item in parents and len(links) < 8:
            links.append(f"{parents[item]} needs {item}")
            item = parents[item]
        chain = ", ".join(reversed(links))
        turns.append(Step(f"{chain}. {step.thought}" if chain else step.thought, step.action).turn())
    return turns


def expert_conversation(game: TextCraftGame, instruction: str) -> list[dict] | None:
    """The expert's successful episode as messages with explicit loss flags; None if it fails."""
    messages = initial_conversation(instruction, game.observation)
    plan = solve(game.observation)
    for step, turn in zip(plan.steps, goal_chain_turns(plan)):
        obs, reward, done = game.step(step.action)
        messages = append_turn(messages, turn, obs)
        if done:
            break
    if not (done and reward == 1):
        return None
    return [dict(m, loss=(m["role"] == "assistant" and i > 3)) if m["role"] == "assistant" else m
            for i, m in enumerate(messages)]


def episode_games(book: RecipeBook, idx: int, variants: int, renamed: int, seed: int):
    """(variant number, game, renaming) of every episode of one task: the
    original, ``variants - 1`` redraws, then ``renamed`` renamed redraws."""
    for v in range(variants + renamed):
        if v == 0:
            yield v, TextCraftGame(idx, book=book), {}
            continue
        rng = random.Random(f"{seed}-{idx}-{v}")
        game = variant_game(book, idx, rng)
        yield v, game, (renaming(book, game, rng) if v >= variants else {})


def make_rows(indices: list[int], variants: int, seed: int, instruction: str,
              renamed: int = 0) -> tuple[list[dict], list[str]]:
    book = load_recipe_book()
    rows, problems = [], []
    for idx in tqdm(indices, desc="expert trajectories"):
        for v, game, mapping in episode_games(book, idx, variants, renamed, seed):
            goal = item_text(game.goal)
            try:
                messages = expert_conversation(game, instruction)
            except UnsolvableTask as exc:
                messages, reason = None, str(exc)
            else:
                reason = "the plan did not reach the goal"
            if messages is None:
                problems.append(f"task {idx} variant {v} ({goal}): {reason}")
                continue
            row = {"task_num": str(idx), "variant": v, "messages": rename_messages(messages, mapping)}
            if mapping:
                row["renamed"] = mapping
            rows.append(row)
    return rows, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="work_dirs/expert/textcraft_train.jsonl", help="output JSONL")
    parser.add_argument("--variants", type=int, default=8, help="episodes per train task (1 = only the original task)")
    parser.add_argument("--renamed", type=int, default=8, help="further episodes per task with made-up item words")
    parser.add_argument("--seed", type=int, default=0, help="seed of the distractor draws and renamings")
    parser.add_argument("--tasks", default="train",
                        help="train (every train task), base (the fixed third a base model is taught) or a JSON "
                             "task list / training_tasks.json")
    parser.add_argument("--limit", type=int, default=None, help="only the first N of those tasks (quick runs)")
    args = parser.parse_args()
    setup_logging()
    if args.variants < 1 or args.renamed < 0:
        raise UsageError(f"--variants {args.variants} / --renamed {args.renamed}: need variants >= 1, renamed >= 0")
    indices = select_tasks(args.tasks, "policy")[: args.limit]
    rows, problems = make_rows(indices, args.variants, args.seed, load_instruction("textcraft"), args.renamed)
    for p in problems:
        log.warning("skipped %s", p)
    atomic_write_jsonl(args.out, rows)
    turns = sum(sum(m["role"] == "assistant" and m["loss"] for m in r["messages"]) for r in rows)
    print(f"wrote {len(rows)} expert episodes ({turns} assistant turns, {sum('renamed' in r for r in rows)} renamed) "
          f"from {len(indices)} train tasks to {args.out}; {len(problems)} skipped")
    return 0


if __name__ == "__main__":
    run_cli(main)
