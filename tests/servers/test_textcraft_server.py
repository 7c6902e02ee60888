"""The local TextCraft server over real HTTP: it plays the game, takes custom
tasks, caps live envs, maps indices to tasks the same way in every process,
and keeps its memory bounded over many create/reset/close cycles."""
from __future__ import annotations

import pytest
import requests

from agentenv_client import EnvServerError, EnvServerUnreachable, StepOutput, TextCraftEnvClient
from agentenv_servers.textcraft_env import TextCraftGame, load_recipe_book
from tests.servers.solver import solve
from tests.support.env_fixtures import rss_kib, start_server, stop_server


def test_client_solves_a_task_over_http(textcraft_server):
    """A solved script played through the client: the reset observation is the
    game's, every step but the last scores 0, the last scores 1 and ends the
    episode, and /detail records it."""
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
    """POST /create with commands and a goal makes that task, playable to success."""
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


def test_live_env_cap_and_close_frees_a_slot():
    """--max-envs refuses one env too many, naming the flag; a close frees a
    slot, ids are never reused; once the server is gone a close is logged, not
    raised, and a new client says how to start the server."""
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
    """Servers started with different PYTHONHASHSEEDs serve the same task for
    every index, the in-process game's."""
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
    """1,000 create/reset/step/close cycles leave no live env and grow the
    server's RSS by less than 4 MiB."""
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
