"""A rule-based TextCraft solver that plays from the observation text alone.

It is the teacher of the bundled tiny policy model (scripts/make_expert_data.py)
and a check that every task of our local environment can be solved. It reads
the `Crafting commands:` list and the goal, chooses one recipe per item (fewest
actions), adds up how many of each item the whole plan consumes, and emits the
actions leaves-first: `get` the total of each base item once, then repeat each
craft as often as its output count requires.

Game rules it relies on (those of the TextCraft environment):
* one `craft` applies a recipe exactly once, with exactly the listed input
  counts, and yields the recipe's output count;
* an item with no recipe in the list is a base item: `get N item` gives any N;
  an item that has a recipe cannot be fetched;
* a generic ingredient such as `planks` or `wool` is not an item: a craft must
  name a concrete item of that kind (`oak planks`), i.e. a recipe output whose
  name ends with the generic word(s) and that is not made from the ingredient
  itself (`purple stained glass` is made from `glass`, so `glass` is a base item).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_RECIPE = re.compile(r"^craft (\d+) (.+?) using (.+)$")
_INGREDIENT = re.compile(r"^(\d+) (.+)$")
_GOAL = re.compile(r"Goal: craft (.+?)\.?\s*$", re.MULTILINE)


class UnsolvableTask(Exception):
    """The observation's recipes cannot produce the goal (reason in the message)."""


@dataclass(frozen=True)
class Recipe:
    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]  # (item or generic name, count), in listed order
    text: str                            # the line as listed


@dataclass
class Step:
    thought: str
    action: str

    def turn(self) -> str:
        return f"Thought: {self.thought}\nAction: {self.action}"


@dataclass
class Plan:
    goal: str
    steps: list[Step] = field(default_factory=list)

    @property
    def actions(self) -> list[str]:
        return [s.action for s in self.steps]


def parse_observation(observation: str) -> tuple[list[Recipe], str]:
    """The recipes (in listed order) and the goal item of a reset observation."""
    goal_match = _GOAL.search(observation)
    if goal_match is None:
        raise UnsolvableTask("no 'Goal: craft <item>.' line in the observation")
    recipes = []
    for line in observation.splitlines():
        m = _RECIPE.match(line.strip())
        if not m:
            continue
        inputs = []
        for part in m.group(3).split(","):
            im = _INGREDIENT.match(part.strip())
            if im is None:
                raise UnsolvableTask(f"cannot read ingredient {part.strip()!r} in {line.strip()!r}")
            inputs.append((im.group(2), int(im.group(1))))
        recipes.append(Recipe(m.group(2), int(m.group(1)), tuple(inputs), line.strip()))
    return recipes, goal_match.group(1).strip()


# The recipe data gives white wool no "wool" kind (only dyed wool has it), so a
# recipe asking for "wool" rejects white wool although its name fits.
NOT_OF_KIND = frozenset({"white wool"})


class _Resolver:
    """Chooses, for every item the goal needs, how to obtain it (get or one recipe),
    minimising the number of actions for the quantity asked."""

    def __init__(self, recipes: list[Recipe]):
        self.by_output: dict[str, list[Recipe]] = {}
        for r in recipes:
            self.by_output.setdefault(r.output, []).append(r)
        self.outputs = list(self.by_output)  # listed order of first appearance
        self.memo: dict[tuple[str, int], tuple[float, str, Recipe | None]] = {}

    def concrete(self, name: str, qty: int = 1, visiting: frozenset[str] = frozenset()) -> tuple[float, str, Recipe | None]:
        """(actions to obtain ``qty``, concrete item name, recipe or None for `get`)."""
        key = (name, qty)
        if key in self.memo:
            return self.memo[key]
        if name in visiting:
            return (math.inf, name, None)
        visiting = visiting | {name}
        if name in self.by_output:
            result = (math.inf, name, None)
            for r in self.by_output[name]:
                crafts = -(-qty // r.count)
                cost = crafts + sum(self.concrete(i, crafts * q, visiting)[0] for i, q in r.inputs)
                if cost < result[0]:
                    result = (cost, name, r)
        else:
            # A generic ingredient names a kind ("planks"): the cheapest listed item of
            # that kind, first listed on ties. Items that are made from the ingredient
            # itself ("stained glass" from "glass") are variants, not kinds of it.
            kinds = [self.concrete(o, qty, visiting) for o in self.outputs
                     if o.endswith(" " + name) and o not in NOT_OF_KIND]
            best = min(kinds, key=lambda c: c[0], default=(math.inf, name, None))
            result = best if not math.isinf(best[0]) else (1.0, name, None)  # else a base item
        if not math.isinf(result[0]):
            self.memo[key] = result
        return result


def solve(observation: str) -> Plan:
    """The expert's plan for a reset observation; raises UnsolvableTask."""
    recipes, goal = parse_observation(observation)
    resolver = _Resolver(recipes)
    cost, _, goal_recipe = resolver.concrete(goal)
    if math.isinf(cost):
        raise UnsolvableTask(f"the listed recipes for {goal} form a cycle")
    if goal_recipe is None:
        raise UnsolvableTask(f"no recipe for the goal {goal} is listed")

    # Depth-first post-order over the chosen recipes: every item after its ingredients.
    choice: dict[str, Recipe | None] = {}
    order: list[str] = []
    edges: dict[str, list[tuple[str, int]]] = {}

    def visit(item: str, qty: int) -> None:
        if item in choice:  # shared ingredient: chosen for its first consumer
            return
        recipe = resolver.concrete(item, qty)[2]
        choice[item] = recipe
        edges[item] = []
        if recipe is not None:
            crafts = -(-qty // recipe.count)
            for name, q in recipe.inputs:
                concrete = resolver.concrete(name, crafts * q)[1]
                edges[item].append((concrete, q))
                visit(concrete, crafts * q)
        order.append(item)

    visit(goal, 1)
    # Total demand: consumers come after their ingredients in `order`, so walk it backwards.
    need = {item: 0 for item in order}
    need[goal] = 1
    crafts: dict[str, int] = {}
    for item in reversed(order):
        recipe = choice[item]
        if recipe is None:
            continue
        crafts[item] = -(-need[item] // recipe.count)
        for ing, qty in edges[item]:
            need[ing] += crafts[item] * qty

    # Thoughts are short on purpose: the bundled tiny model learns from them.
    plan = Plan(goal)
    for item in order:
        recipe = choice[item]
        if recipe is None:
            plan.steps.append(Step(f"{item} is a base item and I need {need[item]}.", f"get {need[item]} {item}"))
            continue
        ingredients = ", ".join(f"{q} {i}" for i, q in edges[item])
        action = f"craft {recipe.count} {item} using {ingredients}"
        n = crafts[item]
        for k in range(n):
            if n == 1:
                thought = f"I can craft {item} now."
            elif k == 0:
                thought = f"I need {need[item]} {item}, so {n} crafts."
            else:
                thought = f"Craft {item} again, {k + 1} of {n}."
            plan.steps.append(Step(thought, action))
    return plan
