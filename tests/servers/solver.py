"""A small test-side TextCraft solver built only on the documented
RecipeBook, independent of the shipped expert (agentenv_servers.textcraft_expert),
so the game and the expert are checked against different code."""
from __future__ import annotations

import math

from agentenv_servers.textcraft_env import TextCraftGame, item_text


def solve(game: TextCraftGame) -> list[str]:
    """A small test-side solver built only on the documented RecipeBook: gets
    base items and crafts bottom-up, reusing leftovers. Returns the actions."""
    book, actions = game.book, []

    def act(action: str) -> str:
        actions.append(action)
        obs, _, _ = game.step(action)
        return obs

    def concrete(name: str, depth: int) -> str:
        """A real item for a (possibly generic) ingredient name."""
        if name not in book.tags:
            return name
        members = [m for m in book.tag_members(name) if book.is_base(m) or book.recipes.get(m)]
        return min(members, key=lambda m: (book.depth(m), m))

    def obtain(item: str, n: int, depth: int = 0) -> None:
        assert depth < 12, f"solver recursion too deep at {item}"
        have = game.inventory.get(item, 0)
        if have >= n:
            return
        if book.is_base(item):
            act(f"get {n - have} {item_text(item)}")
            return
        recipe = min(book.recipes[item], key=lambda r: max(book.depth(i.name) for i in r.inputs))
        crafts = math.ceil((n - have) / recipe.count)
        ins = [(concrete(i.name, depth), i.count) for i in recipe.inputs]
        for _ in range(crafts):
            for name, count in ins:
                obtain(name, count, depth + 1)
            used = ", ".join(f"{c} {item_text(x)}" for x, c in ins)
            obs = act(f"craft {recipe.count} {item_text(item)} using {used}")
            assert obs.startswith("Crafted"), (actions, obs)

    obtain(game.goal, 1)
    return actions
