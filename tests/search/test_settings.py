"""Search settings filled from the task: the default depth of the environment
and the turn limit handed to the sampler."""
from __future__ import annotations

from agent_r.envs import get_env
from agent_r.search import SearchSettings


def test_search_settings_take_the_tasks_depth_and_the_turn_limit():
    """Without MAX_DEPTH the search takes its task's default depth, and the
    sampler gets --max_new_tokens as its turn limit."""
    settings = SearchSettings(task="sciworld", max_new_tokens=37)
    settings.finish()
    assert settings.max_depth == get_env("sciworld").max_depth
    assert settings.sampling().max_new_tokens == 37
