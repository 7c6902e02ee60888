"""The rule-based TextCraft expert (agentenv_servers.textcraft_expert) against
our in-process TextCraft game: it solves every task without a wasted step, and
says why when an observation cannot be solved."""
import pytest

from agentenv_servers.textcraft_expert import UnsolvableTask, parse_observation, solve
from agentenv_servers.textcraft_env import TextCraftGame, load_recipe_book

# Task indices the expert cannot solve, with the reason. Asserted exactly: a
# change in the game or the solver that breaks (or fixes) a task shows up here.
UNSOLVABLE: dict[int, str] = {}


def play(game: TextCraftGame, actions: list[str]) -> tuple[bool, list[str]]:
    observations = []
    for action in actions:
        obs, reward, done = game.step(action)
        observations.append(obs)
        if done:
            return reward == 1, observations
    return False, observations


def test_expert_solves_every_task_index():
    """All 544 tasks are solved, each action before the last one succeeds."""
    n = len(load_recipe_book().goals)
    assert n == 544
    failed: dict[int, str] = {}
    for idx in range(n):
        game = TextCraftGame(idx)
        try:
            plan = solve(game.observation)
        except UnsolvableTask as exc:
            failed[idx] = str(exc)
            continue
        ok, observations = play(game, plan.actions)
        if not ok:
            failed[idx] = f"plan failed: {observations[-1]}"
        # no wasted or failing step: every action before the last succeeds
        assert all(o.startswith(("Got", "Crafted")) for o in observations), (idx, observations)
    assert failed == UNSOLVABLE


def test_quantities_are_aggregated_and_generic_ingredients_resolved():
    """Needs of one ingredient across recipes are summed before fetching, and a
    generic ingredient (planks) resolves to the first listed kind."""
    commands = "\n".join([
        "craft 1 ladder using 7 stick",                      # distractor
        "craft 1 tool using 3 planks, 2 stick",
        "craft 4 stick using 2 planks",
        "craft 4 birch planks using 1 birch logs",
        "craft 4 oak planks using 1 oak logs",
    ])
    observation = f"Crafting commands:\n{commands}\n\nGoal: craft tool."
    recipes, goal = parse_observation(observation)
    assert goal == "tool" and len(recipes) == 5
    plan = solve(observation)
    # 3 planks + 2 for one stick craft = 5 planks = 2 crafts = 2 logs; birch listed first
    assert plan.actions == [
        "get 2 birch logs",
        "craft 4 birch planks using 1 birch logs",
        "craft 4 birch planks using 1 birch logs",
        "craft 4 stick using 2 birch planks",
        "craft 1 tool using 3 birch planks, 2 stick",
    ]
    assert all(s.turn().startswith("Thought: ") and f"\nAction: {s.action}" in s.turn() for s in plan.steps)


def test_variants_made_from_an_ingredient_are_not_kinds_of_it():
    """Purple stained glass is made from glass, not a kind of glass: plain glass is fetched."""
    observation = ("Crafting commands:\ncraft 8 purple stained glass using 8 glass, 1 purple dye\n"
                   "craft 16 glass pane using 6 glass\n\nGoal: craft glass pane.")
    assert solve(observation).actions == ["get 6 glass", "craft 16 glass pane using 6 glass"]


def test_cheaper_recipe_is_chosen_for_the_quantity_needed():
    """Of two recipes for an item, the one needing fewer steps for the quantity wanted is used."""
    # 8 sticks: bamboo needs 8 crafts, planks need 2 + 1 log craft + 1 get
    observation = ("Crafting commands:\ncraft 1 stick using 2 bamboo\ncraft 4 stick using 2 planks\n"
                   "craft 4 oak planks using 1 oak logs\ncraft 1 thing using 8 stick\n\nGoal: craft thing.")
    actions = solve(observation).actions
    assert actions.count("craft 4 stick using 2 oak planks") == 2 and not any("bamboo" in a for a in actions)


@pytest.mark.parametrize("observation, reason", [
    ("Crafting commands:\ncraft 1 a using 1 b\n", "Goal"),
    ("Crafting commands:\ncraft 1 a using 1 b\n\nGoal: craft c.", "no recipe for the goal"),
    ("Crafting commands:\ncraft 1 a using 1 b\ncraft 1 b using 1 a\n\nGoal: craft a.", "cycle"),
])
def test_unsolvable_observations_say_why(observation, reason):
    """No goal line, no recipe for the goal, a recipe cycle: UnsolvableTask names which."""
    with pytest.raises(UnsolvableTask, match=reason):
        solve(observation)
