"""The local SciWorld server (real ScienceWorld JVMs) driven through the
client: an episode, its errors, and that closed envs free their JVMs. Kept
lean: one shared server, one JVM per test that needs an env."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from agentenv_client import EnvServerError, SciworldEnvClient
from tests.support.env_fixtures import rss_kib, start_server, stop_server


def test_reset_steps_and_a_wrong_focus_is_a_disaster(sciworld_server):
    """Reset gives task, variation and observation; look, inventory and moves
    work; focusing on the wrong object scores -100 and ends the episode, a
    step after the end is refused until the next reset."""
    with SciworldEnvClient(sciworld_server, data_len=4639) as env:
        payload = env.reset(0)
        assert payload["task_name"] == "boil" and payload["var_num"] == 0 and payload["done"] is False
        assert env.observe() == payload["task_description"] + "\n" + payload["observation"]
        assert env.observe().startswith("Your task is to boil water")
        assert "This room is called the hallway" in env.look_around()
        assert env.inventory().startswith("In your inventory")

        assert env.map_to_valid_action("Open the door to kitchen") == "open door to kitchen"
        out = env.step("open door to kitchen")
        assert out.state == "The door is now open." and out.reward == 0 and out.done is False
        assert env.step(env.map_to_valid_action("go to   KITCHEN")).state == "You move to the kitchen."
        assert "kitchen" in env.look_around()

        out = env.step("focus on door to hallway")          # not the substance: task failed
        assert out.reward == -100 and out.done is True and env.info["score"] == -100
        with pytest.raises(EnvServerError, match="finished; reset") as info:
            env.step("look around")
        assert info.value.endpoint == "step"

        env.reset(1)                                         # a new episode is playable again
        assert env.step("look around").done is False


def test_server_errors_and_bad_indices(sciworld_server):
    """An unknown id, a call before reset and an index out of range each get
    an error naming the problem."""
    r = requests.post(f"{sciworld_server}/step", json={"id": 424242, "action": "look around"}).json()
    assert r["error"].startswith("The id 424242 is not valid")
    with SciworldEnvClient(sciworld_server, 4639) as env:
        with pytest.raises(EnvServerError, match="call POST /reset first"):
            env.action_hint()
        with pytest.raises(EnvServerError, match="data_idx 4639 is out of range"):
            env.reset(4639)


def _live_children(pid: int) -> list[int]:
    """Child processes of ``pid`` that are still running (not zombies)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == pid and state != "Z":
            out.append(int(stat.parent.name))
    return out


def test_create_reset_close_cycles_free_their_jvms():
    """Closed envs leave no live env, no JVM child process, and less than
    20 MiB of server RSS growth over 4 cycles."""
    proc, url = start_server("agentenv_servers.sciworld", "--max-envs", "1")
    try:
        def cycle(i: int) -> None:
            with SciworldEnvClient(url, 4639) as env:
                env.reset(i)
                env.step("look around")

        cycle(0)
        before = rss_kib(proc.pid)
        for i in range(1, 5):   # JVM start dominates (1-6 s each on a busy 2-core box)
            cycle(i * 997)
        after = rss_kib(proc.pid)
        assert requests.get(f"{url}/health").json()["live_envs"] == 0
        deadline = time.monotonic() + 10
        while _live_children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _live_children(proc.pid) == [], "closed envs left JVMs running"
        assert after - before < 20 * 1024, f"server RSS grew {before} -> {after} KiB over 4 cycles"
    finally:
        stop_server(proc)
