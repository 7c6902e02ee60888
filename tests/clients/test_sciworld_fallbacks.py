"""The SciWorld client against a server without the endpoints the search needs
(AgentGym's upstream server): game numbers, look around, inventory and valid
actions fall back to local computations that match or approximate the real
answers. The endpoints are hidden on our server by marking them missing."""
from __future__ import annotations

from agent_r.envs.sciworld import SCIWORLD_TRAIN_TASK_NUMS
from agentenv_client import SciworldEnvClient
from agentenv_client.sciworld import SCIWORLD_TASKS, build_game_list, build_game_nums


def test_game_numbering_matches_agentgym_and_the_client_fallback(sciworld_server):
    """The server's /game_nums equals the client's local fallback and AgentGym's
    numbering: 4,639 games, each index once, the 23 train task numbers served."""
    with SciworldEnvClient(sciworld_server, 4639) as env:
        nums = env.game_nums()
        env._missing.update({"game_nums"})                   # force the upstream-server fallback
        assert env.game_nums() == nums
    assert sum(map(len, nums.values())) == len(build_game_list()) == 4639
    assert sorted(i for v in nums.values() for i in v) == list(range(4639))
    assert sorted(k for k, v in nums.items() if v) == sorted(SCIWORLD_TRAIN_TASK_NUMS)
    names = sorted(name for _, name, _ in SCIWORLD_TASKS)
    assert nums == build_game_nums(build_game_list(), names)
    assert nums[names.index("boil")] == list(range(30))


def test_fallbacks_for_an_upstream_server_without_patched_endpoints(sciworld_server):
    """Without the patched endpoints the client approximates valid actions
    (sorted, mostly the true ones), look around (from the reset) and inventory ("")."""
    with SciworldEnvClient(sciworld_server, 4639) as env:
        env.reset(0)
        exact = env.valid_action_object_combinations()
        env._missing.update({"look_around", "inventory", "valid_action_object_combinations"})
        approx = env.valid_action_object_combinations()
        # templates x visible objects: most true combinations, not inventory contents
        assert approx == sorted(approx) and "open door to kitchen" in approx
        assert len(set(exact) & set(approx)) > 0.5 * len(exact)
        assert env.look_around().startswith("This room is called the hallway")   # from the reset
        assert env.inventory() == ""
        assert env.map_to_valid_action("open door to kitchen") == "open door to kitchen"
