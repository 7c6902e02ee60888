"""TextCraft: the pure game, and the local server driven through the client."""
from __future__ import annotations

import math

import pytest
import requests

from agent_r.envs import get_env
from agent_r.search import SearchSettings
from agent_r.settings import UsageError, parse
from agentenv_client import EnvClientUsageError, EnvServerError, EnvServerUnreachable, StepOutput, TextCraftEnvClient
from agentenv_client.textcraft import clean_action
from agentenv_servers.textcraft_env import TextCraftGame, item_text, load_recipe_book
from tests.support.env_fixtures import rss_kib, start_server, stop_server


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


# ---- the pure game ---------------------------------------------------------
def test_goal_list_is_agentgyms_544_items_by_ascending_depth():
    book = load_recipe_book()
    assert len(book.goals) == 544
    depths = [book.depth(g) for g in book.goals]
    assert depths == sorted(depths) and depths[0] == 1
    assert TextCraftGame(544).goal == TextCraftGame(0).goal


def test_observation_shows_goal_recipes_plus_at_most_ten_distractors():
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
    game = TextCraftGame(idx)
    solve(game)
    assert game.done and game.goal in game.inventory


def test_game_messages_and_generic_ingredients():
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


# ---- the server, through the client --------------------------------------------
def test_client_solves_a_task_over_http(textcraft_server):
    idx = load_recipe_book().goals.index("minecraft:stone_pickaxe")
    script = solve(TextCraftGame(idx))
    with TextCraftEnvClient(textcraft_server, data_len=544) as env:
        assert isinstance(env.env_id, int)
        payload = env.reset(idx)
        assert payload["observation"] == TextCraftGame(idx).observation == env.observe()
        assert env.observe().endswith("Goal: craft stone pickaxe.")
        outs = [env.step(a) for a in script]
        assert all(isinstance(o, StepOutput) for o in outs)
        assert outs[-1] == StepOutput("Crafted 1 minecraft:stone_pickaxe", 1.0, True)
        assert [o.reward for o in outs[:-1]] == [0.0] * (len(outs) - 1)
        assert env.info == {"observation": outs[-1].state, "reward": 1.0, "done": True}
        detail = requests.get(f"{textcraft_server}/detail", params={"id": env.env_id}).json()
        assert detail["done"] is True and detail["goal"] == "minecraft:stone_pickaxe"


def test_create_with_custom_commands_and_goal(textcraft_server):
    body = {"commands": "craft 4 stick using 2 planks", "goal": "minecraft:stick"}
    made = requests.post(f"{textcraft_server}/create", json=body).json()
    try:
        assert made["observation"] == "Crafting commands:\ncraft 4 stick using 2 planks\n\nGoal: craft stick."
        step = lambda a: requests.post(f"{textcraft_server}/step", json={"id": made["id"], "action": a}).json()
        step("get 1 birch logs")
        step("craft 4 birch planks using 1 birch logs")
        assert step("craft 4 stick using 2 birch planks") == {"observation": "Crafted 4 minecraft:stick",
                                                              "reward": 1.0, "done": True}
    finally:
        assert requests.post(f"{textcraft_server}/close", json={"id": made["id"]}).json() is True


def test_client_cleans_actions_like_agentgym():
    assert clean_action("  craft 4 oak-planks\nusing 1 oak logs.  ") == "craft 4 oakplanks using 1 oak logs"
    assert clean_action("get 1 lapis_lazuli!") == "get 1 lapislazuli"


def test_conversation_start_and_instruction_override(textcraft_server, tmp_path, monkeypatch):
    with TextCraftEnvClient(textcraft_server, 544) as env:
        human, gpt = env.conversation_start
        assert human == {"from": "human", "loss": None, "value": env.instruction}
        assert gpt == {"from": "gpt", "loss": False, "value": "Ok."}
        assert "Thought:" in env.instruction and "Action:" in env.instruction and "craft" in env.instruction
    custom = tmp_path / "prompt.txt"
    custom.write_text("My own TextCraft prompt.\n")
    with TextCraftEnvClient(textcraft_server, 544, instruction_file=str(custom)) as env:
        assert env.instruction == "My own TextCraft prompt."
    # scripts take the file from AGENTENV_INSTRUCTION_FILE through their settings
    settings = parse(SearchSettings, [], {"AGENTENV_INSTRUCTION_FILE": str(custom)})
    spec = get_env("textcraft")
    with spec.make_client(textcraft_server, instruction_file=settings.backend.instruction_file) as env:
        assert env.conversation_start[0]["value"] == "My own TextCraft prompt."
    with pytest.raises(EnvClientUsageError, match="missing.txt does not exist"):
        TextCraftEnvClient(textcraft_server, 544, instruction_file=str(tmp_path / "missing.txt"))


def test_server_errors_surface_with_the_server_message(textcraft_server):
    env = TextCraftEnvClient(textcraft_server, 544)
    dead_id = env.env_id
    env.close()
    env.close()  # idempotent
    probe = TextCraftEnvClient(textcraft_server, 544)
    probe.env_id = dead_id
    with pytest.raises(EnvServerError) as info:
        probe.step("inventory")
    assert info.value.server_message.startswith(f"The id {dead_id} is not valid")
    assert info.value.endpoint == "step" and info.value.env_id == dead_id
    assert "/step" in str(info.value) and textcraft_server in str(info.value)
    probe.env_id = None
    with pytest.raises(EnvServerError, match="HTTP 422"):
        probe._request("POST", "reset", json_body={"data_idx": 1})   # no id at all


def test_live_env_cap_and_close_frees_a_slot():
    proc, url = start_server("agentenv_servers.textcraft", "--max-envs", "2")
    try:
        a, b = TextCraftEnvClient(url, 544), TextCraftEnvClient(url, 544)
        with pytest.raises(EnvServerError, match="too many live environments.*--max-envs"):
            TextCraftEnvClient(url, 544)
        a.close()
        c = TextCraftEnvClient(url, 544)
        assert c.env_id not in (a.env_id, b.env_id)   # ids are never reused
        assert requests.get(f"{url}/health").json()["live_envs"] == 2
    finally:
        stop_server(proc)
    b.close()  # server gone: logged, not raised
    with pytest.raises(EnvServerUnreachable) as info:
        TextCraftEnvClient(url, 544, max_retries=2)
    msg = str(info.value)
    assert url in msg and "python -m agentenv_servers.textcraft" in msg
    assert info.value.user_facing is True


def test_index_to_task_is_identical_across_hash_seeds():
    indices = [0, 7, 100, 183, 300, 417, 543, 544, 1000]
    seen = []
    for seed in ("1", "987"):
        proc, url = start_server("agentenv_servers.textcraft", env={"PYTHONHASHSEED": seed})
        try:
            with TextCraftEnvClient(url, 544) as env:
                seen.append([env.reset(i)["observation"] for i in indices])
        finally:
            stop_server(proc)
    assert seen[0] == seen[1] == [TextCraftGame(i).observation for i in indices]


def test_a_thousand_create_reset_close_cycles_keep_memory_bounded():
    proc, url = start_server("agentenv_servers.textcraft")
    try:
        s = requests.Session()

        def cycles(n: int, start: int) -> None:
            for i in range(start, start + n):
                env_id = s.post(f"{url}/create", json={}).json()["id"]
                assert s.post(f"{url}/reset", json={"id": env_id, "data_idx": i}).json()["id"] == env_id
                s.post(f"{url}/step", json={"id": env_id, "action": "inventory"})
                assert s.post(f"{url}/close", json={"id": env_id}).json() is True

        with TextCraftEnvClient(url, 544) as env:  # warm the per-index task cache (544 entries)
            for i in range(544):
                env.reset(i)
        cycles(100, 0)                       # warm up the allocator
        before = rss_kib(proc.pid)
        cycles(1000, 100)
        after = rss_kib(proc.pid)
        assert s.get(f"{url}/health").json()["live_envs"] == 0
        assert after - before < 4 * 1024, f"server RSS grew {before} -> {after} KiB over 1,000 cycles"
    finally:
        stop_server(proc)
