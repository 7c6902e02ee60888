"""Verifier training data for the bundled TextCraft model: the project's own
verifier prompt (agent_r.revision, built and history-truncated exactly as
path_collection builds it) over steps of TRAIN-task trajectories, answered
with a short reason and a final ``Judgment: Good|Bad|Uncertain`` line.

Why these labels: TextCraft's ground truth is computable. An action the game
rejects wastes a step (Bad); an item got or crafted that nothing on the way
to the goal uses heads away from it (Bad); getting or crafting an item the
goal's recipes use, or the goal itself, is a step of a valid plan (Good);
checking the inventory changes nothing (Uncertain). ``ground_truth`` is also
what bench/bench_verifier.py scores the model's judgements against.

Where the steps come from: (1) the expert's plans, every step Good; (2) the
same plans with one mistake put in at some step (a craft before its
ingredients, wrong counts, fetching a craftable item, a distractor recipe,
a malformed command, inventory); (3) the bundled policy's own search trees
on train tasks (``--trees``), so the mistakes the policy really makes are in
the data. A share of episodes is renamed with made-up item words, as for the
policy data. Test tasks are never used.

    python -m scripts.make_verifier_data --out work_dirs/expert/textcraft_verifier.jsonl \\
        --trees work_dirs/v2/mcts_train_v1/textcraft/textcraft-tiny-v1
"""
from __future__ import annotations

import argparse
import functools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from agent_r import paths
from agent_r.io import atomic_write_jsonl
from agent_r.llm import BUNDLED_MODEL, Backend, chat_token_count, load_tokenizer
from agent_r.revision_data import PathSettings
from agent_r.settings import UsageError, run_cli, setup_logging
from agent_r.tree import leaf_paths, load_tree
from agent_r.verifier import BAD, GOOD, UNCERTAIN, fit_history
from agentenv_servers.textcraft_env import TextCraftGame, item_text, load_recipe_book
from agentenv_servers.textcraft_expert import NOT_OF_KIND, parse_observation, solve
from scripts.make_expert_data import episode_games, rename_text, renaming, select_tasks

DEMO_MAX_TOKEN_LENGTH = 2048   # scripts/demo.sh's MAX_TOKEN_LENGTH: the budget path_collection fits prompts to
DEMO_MAX_NEW_TOKENS = 60       # scripts/demo.sh's MAX_NEW_TOKENS: what a verifier reply may take
_GOT = re.compile(r"^Got (\d+) (.+?)\s*$")
_CRAFTED = re.compile(r"^Crafted (\d+) (?:minecraft:)?(\S+)\s*$")

Step = tuple[str, str]  # (action, observation)


# --------------------------------------------------------------------------- ground truth

@dataclass(frozen=True)
class TaskFacts:
    goal: str
    needed: frozenset[str]      # every item some recipe on the way to the goal uses (alternatives too)
    consumer: dict[str, str]    # item -> the first listed recipe line on the way to the goal that uses it


@functools.lru_cache(maxsize=4096)
def task_facts(task: str) -> TaskFacts:
    """What the goal needs, read from the task text (its recipe list) as the expert reads it."""
    recipes, goal = parse_observation(task)
    by_output: dict[str, list] = {}
    for r in recipes:
        by_output.setdefault(r.output, []).append(r)
    needed, consumer, todo = set(), {}, [goal]
    while todo:
        for recipe in by_output.get(todo.pop(), []):
            for name, _ in recipe.inputs:
                for item in concrete_items(name, by_output):
                    consumer.setdefault(item, recipe.text)
                    if item not in needed:
                        needed.add(item)
                        todo.append(item)
    return TaskFacts(goal, frozenset(needed), consumer)


def concrete_items(name: str, by_output: dict[str, list]) -> list[str]:
    """The items that fill ingredient ``name``: itself, or for a generic name
    ("planks") the listed items of that kind ("oak planks"), leaving out
    variants made from the name itself ("stained glass" from "glass"), the
    expert's rule."""
    if name in by_output:
        return [name]

    def made_from(item: str, seen: frozenset[str]) -> bool:
        inputs = [i for r in by_output.get(item, []) for i, _ in r.inputs]
        return name in inputs or any(i not in seen and made_from(i, seen | {i}) for i in inputs)

    kinds = [o for o in by_output if o.endswith(" " + name) and o not in NOT_OF_KIND and not made_from(o, frozenset({o}))]
    return kinds or [name]


def failure_reason(action: str, obs: str) -> str:
    if obs.startswith("Could not find enough items"):
        return "The craft failed: the agent does not have all the ingredients yet, so the step is wasted."
    if obs.startswith("Could not find a valid recipe"):
        return "The craft failed: no listed recipe takes these ingredients and counts, so the step is wasted."
    if obs.startswith("Could not find ") and action.startswith("get"):
        return f"The get failed: {obs[len('Could not find '):].strip()} is not a base item, so the step is wasted."
    return "The action is not a valid command, so nothing happened and the step is wasted."


def ground_truth(task: str, action: str, obs: str) -> tuple[str, str]:
    """(label, one-sentence reason) of a step, from the task's recipes and the
    game's answer. A reason opens with what the observation says happened
    ("It got ..." / "The craft failed ...") and only then decides, so the
    model reads the step before it judges it."""
    facts = task_facts(task)
    if obs.startswith("Inventory:"):
        return UNCERTAIN, "It only checked the inventory: neither progress nor a mistake yet."
    got, crafted = _GOT.match(obs), _CRAFTED.match(obs)
    if not (got or crafted):
        return BAD, failure_reason(action, obs)
    verb, item = ("got", got.group(2)) if got else ("crafted", item_text(crafted.group(2)))
    if item == facts.goal:
        return GOOD, f"It {verb} {item}, the goal."
    if item in facts.needed:
        return GOOD, f"It {verb} {item}, used on the way to {facts.goal}: {facts.consumer[item]}."
    return BAD, f"It {verb} {item}, but nothing on the way to {facts.goal} uses it."


def verifier_reply(label: str, reason: str) -> str:
    return f"{reason}\nJudgment: {label}"


# --------------------------------------------------------------------------- prompts

class TokenCounter(Backend):
    """A backend that only counts tokens (what fit_history asks of one), with
    the context limit the hf backend reports for the model."""

    name = "token-counter"

    def __init__(self, model_dir: str) -> None:
        super().__init__()
        self.tokenizer = load_tokenizer(model_dir)
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.context_limit = config.get("max_position_embeddings")

    def generate(self, requests, sampling):
        raise NotImplementedError("TokenCounter only counts tokens")

    def count_tokens(self, messages: list[dict]) -> int:
        return chat_token_count(self.tokenizer, messages)


def revision_config(max_token_length: int):
    """path_collection's own RevisionConfig for TextCraft at this prompt budget."""
    return PathSettings(task="textcraft", max_token_length=max_token_length,
                        max_new_tokens=DEMO_MAX_NEW_TOKENS).revision_config()


def example(counter, cfg, task: str, history: list[Step], action: str, obs: str, mapping: dict[str, str]) -> dict:
    """One training row: the verifier prompt exactly as path_collection sends it
    for this step, and the reply (the only trained message)."""
    label, reason = ground_truth(task, action, obs)
    r = functools.partial(rename_text, mapping=mapping)
    messages = fit_history(counter, cfg, r(task), [(r(a), r(o)) for a, o in history], r(action), r(obs),
                            len(history) + 1)
    return {"label": label, "step_no": len(history) + 1,
            "messages": messages + [{"role": "assistant", "content": verifier_reply(label, r(reason)), "loss": True}]}


# --------------------------------------------------------------------------- steps to judge

def wrong_counts(craft: str, rng: random.Random) -> str:
    """The craft with one ingredient count changed."""
    head, ingredients = craft.split(" using ", 1)
    parts = ingredients.split(", ")
    i = rng.randrange(len(parts))
    n, name = parts[i].split(" ", 1)
    parts[i] = f"{int(n) + (rng.choice([-1, 1]) if int(n) > 1 else 1)} {name}"
    return f"{head} using {', '.join(parts)}"


def mistakes(plan: list[str], k: int, task: str, rng: random.Random) -> list[str]:
    """Wrong actions an agent could take instead of the plan's step ``k``."""
    recipes, goal = parse_observation(task)
    facts = task_facts(task)
    crafts = [a for a in plan[k:] if a.startswith("craft") and a != plan[k]]
    out = [rng.choice(crafts)] if crafts else []
    nxt = next((a for a in plan[k:] if a.startswith("craft")), None)
    if nxt:
        out.append(wrong_counts(nxt, rng))
    out.append(f"get {rng.randint(1, 4)} {rng.choice([r.output for r in recipes])}")
    distractors = [r for r in recipes if r.output not in facts.needed and r.output != goal]
    if distractors:
        d = rng.choice(distractors)
        out.append(d.text)
        spare = [n for n, _ in d.inputs if n not in facts.needed and not any(r.output == n for r in recipes)]
        if spare:
            out.append(f"get {rng.randint(1, 8)} {rng.choice(spare)}")
    out.append(rng.choice([f"craft {goal}", f"craft 1 {goal}", "look", f"get {goal}", "inventory", "inventory"]))
    return out


def replay(game_args: tuple[int, str, str], actions: list[str]) -> tuple[str, list[Step]]:
    """(task text, steps) of ``actions`` played from the start of a fresh game."""
    idx, commands, goal = game_args
    game = TextCraftGame(idx, commands=commands, goal=goal)
    task, steps = game.observation, []
    for a in actions:
        steps.append((a, game.step(a)[0].replace("\n", " ")))
    return task, steps


def expert_steps(indices: list[int], seed: int, episodes: tuple[int, int], per_episode: int,
                 mistakes_per_step: int):
    """(pack key, task idx, task, history, action, obs, renaming, source) of
    expert plans' steps and of mistakes put in at those steps."""
    book = load_recipe_book()
    for idx in tqdm(indices, desc="expert steps"):
        for v, game, mapping in episode_games(book, idx, *episodes, seed + 1):
            rng = random.Random(f"{seed}-verifier-{idx}-{v}")
            args = (idx, game.commands, game.goal)
            plan = solve(game.observation).actions
            task, steps = replay(args, plan)
            for k in sorted(rng.sample(range(len(plan)), min(per_episode, len(plan)))):
                pack = f"e{idx}-{v}-{k}"   # the right step and the wrong ones at the same point
                yield pack, idx, task, steps[:k], steps[k][0], steps[k][1], mapping, "expert"
                for wrong in rng.sample(mistakes(plan, k, task, rng), mistakes_per_step):
                    _, tail = replay(args, plan[:k] + [wrong])
                    yield pack, idx, task, steps[:k], wrong, tail[-1][1], mapping, "mistake"


def tree_steps(folders: list[str], seed: int, per_tree: int, train: set[int]):
    """Distinct steps of the leaf paths of search trees on train tasks (test trees refused)."""
    files = sorted((path, idx) for f in folders for idx, path in paths.tree_files(f))
    book = load_recipe_book()
    for path, idx in tqdm(files, desc="tree steps"):
        if idx not in train:
            raise UsageError(f"{path}: task {idx} is not one of the chosen train tasks (--tasks); verifier data "
                             "uses those only")
        root = load_tree(path)
        task = root.state[3]["content"]
        seen: dict[tuple, tuple] = {}
        for leaf_path in leaf_paths(root):
            history = [(n.action, n.obs) for n in leaf_path]
            for k in range(len(history)):
                seen.setdefault(tuple(history[:k + 1]), (history[:k], *history[k]))
        rng = random.Random(f"{seed}-tree-{idx}")
        picked = sorted(rng.sample(sorted(seen.values(), key=repr), min(per_tree, len(seen))), key=repr)
        game = TextCraftGame(idx, book=book)
        for start in range(0, len(picked), 3):   # neighbours in history order share a pack
            mapping = renaming(book, game, rng) if rng.random() < 0.3 else {}
            for h, action, obs in picked[start:start + 3]:
                yield f"t{idx}-{start}", idx, task, h, action, obs, mapping, "tree"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="work_dirs/expert/textcraft_verifier.jsonl", help="output JSONL")
    parser.add_argument("--trees", nargs="*", default=[], help="folders of search trees on TRAIN tasks")
    parser.add_argument("--episodes", type=int, default=1, help="expert episodes per train task with real item names")
    parser.add_argument("--renamed", type=int, default=1, help="further expert episodes per task with made-up item words")
    parser.add_argument("--per_episode", type=int, default=2, help="expert steps judged per episode")
    parser.add_argument("--mistakes", type=int, default=1, help="wrong steps put in at each judged expert step")
    parser.add_argument("--per_tree", type=int, default=12, help="distinct steps judged per search tree")
    parser.add_argument("--max_token_length", type=int, default=DEMO_MAX_TOKEN_LENGTH,
                        help="the verifier prompt budget path_collection fits prompts to (MAX_TOKEN_LENGTH)")
    parser.add_argument("--tokenizer", default=str(BUNDLED_MODEL), help="model folder whose tokenizer counts tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default="train",
                        help="train (every train task), base (the fixed third a base model is taught) or a JSON "
                             "task list / training_tasks.json; trees of other tasks are refused")
    parser.add_argument("--limit", type=int, default=None, help="only the first N of those tasks (quick runs)")
    args = parser.parse_args()
    setup_logging()
    chosen = select_tasks(args.tasks, "verifier")
    indices = chosen[: args.limit]
    counter, cfg = TokenCounter(args.tokenizer), revision_config(args.max_token_length)
    rows = []
    if args.episodes < 1:
        raise UsageError(f"--episodes {args.episodes}: must be >= 1")
    for source in (expert_steps(indices, args.seed, (args.episodes, args.renamed), args.per_episode, args.mistakes),
                   tree_steps(args.trees, args.seed, args.per_tree, set(chosen))):
        for pack, idx, task, history, action, obs, mapping, kind in source:
            rows.append({"task_num": str(idx), "source": kind, "pack": pack,
                         **example(counter, cfg, task, history, action, obs, mapping)})
    atomic_write_jsonl(args.out, rows)
    counts = Counter((r["source"], r["label"]) for r in rows)
    print(f"wrote {len(rows)} verifier examples to {args.out}: "
          + ", ".join(f"{s}/{label} {n}" for (s, label), n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    run_cli(main)
