"""The TextCraft game itself (agentenv_servers.textcraft_env), in process: the
goal list, the observation, the game's messages, and that every task can be
solved with the documented recipe structure."""
from __future__ import annotations

import pytest

from agentenv_servers.textcraft_env import TextCraftGame, load_recipe_book
from tests.servers.solver import solve


def test_goal_list_is_agentgyms_544_items_by_ascending_depth():
    """544 goals sorted by recipe depth, starting at depth 1; indices wrap
    around (544 is goal 0)."""
    book = load_recipe_book()
    assert len(book.goals) == 544
    depths = [book.depth(g) for g in book.goals]
    assert depths == sorted(depths) and depths[0] == 1
    assert TextCraftGame(544).goal == TextCraftGame(0).goal


def test_observation_shows_goal_recipes_plus_at_most_ten_distractors():
    """The observation lists every recipe the goal needs plus 1-10 other
    recipes, no line twice, then the goal; the same index gives the same text."""
    book = load_recipe_book()
    idx = book.goals.index("minecraft:crafting_table")
    game = TextCraftGame(idx)
    head, goal_line = game.observation.split("\n\n")
    assert head.startswith("Crafting commands:\n") and goal_line == "Goal: craft crafting table."
    lines = head.splitlines()[1:]
    own = {r.text for r in book.recipe_closure(game.goal)}
    assert "craft 1 crafting table using 4 planks" in lines and own <= set(lines)
    assert 0 < len(set(lines) - own) <= 10 and len(lines) == len(set(lines))
    assert TextCraftGame(idx).observation == game.observation  # reproducible per index


@pytest.mark.parametrize("idx", list(range(0, 544, 17)) + [543])
def test_every_sampled_task_is_solvable_with_the_documented_recipe_structure(idx):
    """A solver that knows only the documented recipe book reaches the goal."""
    game = TextCraftGame(idx)
    solve(game)
    assert game.done and game.goal in game.inventory


def test_game_messages_and_generic_ingredients():
    """The game's answers: empty inventory, generic tags and craftable items
    cannot be fetched, missing or wrong ingredients are named, an unknown
    command cannot execute, crafting the goal ends the game with reward 1."""
    book = load_recipe_book()
    game = TextCraftGame(book.goals.index("minecraft:crafting_table"))
    assert game.step("inventory") == ("Inventory: You are not carrying anything.", 0.0, False)
    assert game.step("get 1 planks")[0] == "Could not find planks"                 # generic tag
    assert game.step("get 2 crafting table")[0] == "Could not find crafting table"  # craftable
    assert game.step("get 1 oak logs") == ("Got 1 oak logs", 0.0, False)
    assert game.step("craft 4 oak planks using 1 oak logs")[0] == "Crafted 4 minecraft:oak_planks"
    assert game.step("inventory")[0] == "Inventory: [oak planks] (4) "
    assert game.step("craft 1 crafting table using 4 planks")[0].startswith("Could not find enough items")
    assert game.step("craft 1 crafting table using 3 oak planks")[0].startswith("Could not find a valid recipe")
    assert game.step("dance")[0] == "Could not execute dance"
    assert game.step("craft 1 crafting table using 4 oak planks") == ("Crafted 1 minecraft:crafting_table", 1.0, True)
    assert game.inventory == {"minecraft:crafting_table": 1}
