"""Expert TextCraft trajectories on the TRAIN split, in our conversation format.

Each train task is played by the rule-based expert (agentenv_servers/textcraft_expert.py)
in the in-process game; the conversation is built exactly as the search and
evaluation build it (instruction, "Ok.", observation, then Thought/Action turns
and the cleaned observations). Variants > 0 of a task show the same goal with
another draw of distractor recipes in another order, so the model learns to
read the list instead of memorising positions. Test tasks are never used.

    python -m scripts.make_expert_data --out work_dirs/expert/textcraft_train.jsonl --variants 8
"""
from __future__ import annotations

import argparse
import logging
import random

from tqdm import tqdm

from agent_r.settings import UsageError, run_cli, setup_logging
from agent_r.conversation import append_turn, initial_conversation
from agent_r.io import atomic_write_jsonl
from agent_r.envs import get_env
from agentenv_client import load_instruction
from agentenv_servers.textcraft_env import RecipeBook, TextCraftGame, item_text, load_recipe_book
from agentenv_servers.textcraft_expert import UnsolvableTask, solve

log = logging.getLogger("make_expert_data")


def train_indices() -> list[int]:
    """The bundled TextCraft train split (test tasks are never used)."""
    return get_env("textcraft").split_indices("train")


def variant_game(book: RecipeBook, idx: int, rng: random.Random) -> TextCraftGame:
    """Task ``idx``'s goal with a fresh draw of distractors and a fresh order."""
    goal = book.task(idx)[0]
    return TextCraftGame(idx, book=book, commands="\n".join(book.draw_lines(goal, rng, vary_count=True)), goal=goal)


def expert_conversation(game: TextCraftGame, instruction: str) -> list[dict] | None:
    """The expert's successful episode as messages with explicit loss flags; None if it fails."""
    messages = initial_conversation(instruction, game.observation)
    plan = solve(game.observation)
    for step in plan.steps:
        obs, reward, done = game.step(step.action)
        messages = append_turn(messages, step.turn(), obs)
        if done:
            break
    if not (done and reward == 1):
        return None
    return [dict(m, loss=(m["role"] == "assistant" and i > 3)) if m["role"] == "assistant" else m
            for i, m in enumerate(messages)]


def make_rows(indices: list[int], variants: int, seed: int, instruction: str) -> tuple[list[dict], list[str]]:
    book = load_recipe_book()
    rows, problems = [], []
    for idx in tqdm(indices, desc="expert trajectories"):
        for v in range(variants):
            game = TextCraftGame(idx, book=book) if v == 0 else variant_game(book, idx, random.Random(f"{seed}-{idx}-{v}"))
            try:
                messages = expert_conversation(game, instruction)
            except UnsolvableTask as exc:
                messages, reason = None, str(exc)
            else:
                reason = "the plan did not reach the goal"
            if messages is None:
                problems.append(f"task {idx} variant {v} ({item_text(game.goal)}): {reason}")
                continue
            rows.append({"task_num": str(idx), "variant": v, "messages": messages})
    return rows, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="work_dirs/expert/textcraft_train.jsonl", help="output JSONL")
    parser.add_argument("--variants", type=int, default=8, help="episodes per train task (1 = only the original task)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the distractor draws")
    parser.add_argument("--limit", type=int, default=None, help="only the first N train tasks (quick runs)")
    args = parser.parse_args()
    setup_logging()
    if args.variants < 1:
        raise UsageError(f"--variants {args.variants}: must be >= 1")
    indices = train_indices()[: args.limit]
    rows, problems = make_rows(indices, args.variants, args.seed, load_instruction("textcraft"))
    for p in problems:
        log.warning("skipped %s", p)
    atomic_write_jsonl(args.out, rows)
    turns = sum(sum(m["role"] == "assistant" and m["loss"] for m in r["messages"]) for r in rows)
    print(f"wrote {len(rows)} expert episodes ({turns} assistant turns) from {len(indices)} train tasks "
          f"to {args.out}; {len(problems)} skipped")
    return 0


if __name__ == "__main__":
    run_cli(main)
