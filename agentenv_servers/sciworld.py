"""ScienceWorld server, AgentGym-compatible (agentenv-sciworld's endpoints and
payloads) plus the endpoints the Agent-R search used: /game_nums, /look_around,
/inventory, /valid_action_object_combinations.
``python -m agentenv_servers.sciworld --port 36002``.

Every env is one ScienceWorld JVM (about 200 MB with the heap cap below), so
the number of live envs is capped (default 4). Steps call the simulator
directly instead of ``ScienceWorldEnv.step``, which also computes the valid
action list each step and is 10-50x slower; score and done follow the same rules
(score is 0-100, -100 on failure; done on completion, failure, or step limit).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

from fastapi import FastAPI

from agentenv_client.sciworld import SCIWORLD_TASKS, _normalise, build_game_list, build_game_nums
from agentenv_servers.common import (EnvError, EnvTable, IdBody, ReplayBody, ResetBody, StepBody, add_health,
                                     check_replay, guarded, serve)

log = logging.getLogger(__name__)

DEFAULT_PORT = 36002
DEFAULT_MAX_ENVS = 4
STEP_LIMIT = 100                     # ScienceWorld's default envStepLimit, as AgentGym used it
JVM_OPTIONS = "-Xmx300m -XX:+UseSerialGC"


class SciEnv:
    """One ScienceWorld simulator plus the bookkeeping AgentGym's server keeps."""

    def __init__(self):
        from scienceworld import ScienceWorldEnv

        self.env = ScienceWorldEnv(envStepLimit=STEP_LIMIT)
        self.lock = threading.Lock()     # one request at a time per JVM
        self.info: dict = {"deleted": False, "done": False}
        self.loaded = False
        self.last_score = 0

    def reset(self, task_name: str, variation: int) -> dict:
        self.env.load(task_name, variation)
        self.loaded = True
        self.last_score = 0
        description = self.env.get_task_description()
        step = self.step("look around", check=False)
        self.info = {"task_name": task_name, "var_num": variation, "task_description": description,
                     "observation": step["observation"], "reward": step["reward"], "score": step["score"],
                     "deleted": False, "done": step["done"]}
        return dict(self.info)

    def step(self, action: str, check: bool = True) -> dict:
        if check:
            self.require_loaded()
            if self.info.get("done"):
                raise EnvError("The episode has finished; reset the environment to play again")
        sim = self.env.server
        observation = sim.step(action)
        score = int(round(100 * sim.getScore()))
        done = bool(sim.getCompleted()) or score < 0 or sim.getNumMoves() > STEP_LIMIT
        reward, self.last_score = score - self.last_score, score
        payload = {"observation": observation, "reward": reward, "score": score, "done": done}
        self.info.update(payload)
        return payload

    def require_loaded(self) -> None:
        if not self.loaded:
            raise EnvError("no task loaded in this environment yet; call POST /reset first")

    def close(self) -> None:
        try:
            self.env.close()
        except Exception as exc:  # noqa: BLE001 - the JVM may already be gone
            log.warning("closing a ScienceWorld JVM failed: %s", exc)


def make_app(max_envs: int = DEFAULT_MAX_ENVS, replay: bool = True) -> FastAPI:
    os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_OPTIONS)   # inherited by every JVM we start
    table: EnvTable[SciEnv] = EnvTable(max_envs, close_env=SciEnv.close)
    games: list[tuple[str, int]] = []
    task_names: list[str] = []
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        table.close_all()   # stop our JVMs on a clean shutdown

    app = FastAPI(title="ScienceWorld (Agent-R local server)", lifespan=lifespan)
    add_health(app, "sciworld", table)

    learning = threading.Lock()   # envs are created concurrently: learn the list exactly once

    def learn_games(env: SciEnv) -> None:
        """The game list comes from the simulator itself, once."""
        with learning:
            if games:
                return
            from scienceworld.constants import ID2TASK

            tasks = [(key, name, env.env.get_max_variations(name)) for key, name in ID2TASK.items()]
            if tuple(tasks) != SCIWORLD_TASKS:
                log.warning("this scienceworld's task table differs from the one the client's fallback assumes")
            task_names.extend(env.env.get_task_names())
            games.extend(build_game_list(tasks))

    def with_env(env_id: int, fn, loaded: bool = True):
        env = table.get(env_id)
        with env.lock:
            if loaded:
                env.require_loaded()
            return fn(env)

    @app.get("/")
    def hello():
        return "This is environment ScienceWorld."

    @app.get("/identity")
    def identity() -> dict:
        """What this server is, so clients can tell it from AgentGym's (which
        has no such endpoint). The game count is the simulator's once an env
        has started, before that the task table's."""
        return {"server": "agent-r", "env": "sciworld", "tasks": len(games) or len(build_game_list()),
                "task_order": "AgentGym's game list"}

    @app.post("/create")
    @guarded
    def create() -> dict:
        env_id = table.reserve()
        try:
            env = SciEnv()
            learn_games(env)
        except Exception:
            table.close(env_id)
            raise
        table.put(env_id, env)
        return {"id": env_id}

    def game(data_idx: int) -> tuple[str, int]:
        if not 0 <= data_idx < len(games):
            raise EnvError(f"data_idx {data_idx} is out of range: this server has {len(games)} games "
                           f"(0-{len(games) - 1})")
        return games[data_idx]

    @app.post("/reset")
    @guarded
    def reset(body: ResetBody) -> dict:
        name, variation = game(body.data_idx)
        return with_env(body.id, lambda e: e.reset(name, variation), loaded=False)

    def replay_in(env: SciEnv, name: str, variation: int, actions: list[str]) -> dict:
        out = env.reset(name, variation)
        look = out["observation"]
        for action in actions:
            out = env.step(action)
            if _normalise(action) == "look around":
                look = out["observation"]
        return {**out, "steps": len(actions), "last_look": look}

    if replay:
        @app.post("/replay")
        @guarded
        def replay_actions(body: ReplayBody) -> dict:
            """/reset and a /step of every action in one request (see common);
            ``last_look`` is the latest look-around text (the reset's or a
            replayed ``look around``), which the client keeps."""
            check_replay(body)
            name, variation = game(body.data_idx)
            return with_env(body.id, lambda e: replay_in(e, name, variation, body.actions), loaded=False)

    @app.post("/step")
    @guarded
    def step(body: StepBody) -> dict:
        return with_env(body.id, lambda e: e.step(body.action), loaded=False)

    @app.get("/observation")
    @guarded
    def observation(id: int):
        return with_env(id, lambda e: e.info["observation"])

    @app.get("/action_hint")
    @guarded
    def action_hint(id: int) -> dict:
        return with_env(id, lambda e: {"possible_actions": e.env.get_possible_actions(),
                                       "possible_objects": e.env.get_possible_objects()})

    @app.get("/goals")
    @guarded
    def goals(id: int) -> dict:
        return with_env(id, lambda e: {"goals": e.env.get_goal_progress()})

    @app.get("/detail")
    @guarded
    def detail(id: int) -> dict:
        return with_env(id, lambda e: dict(e.info), loaded=False)

    @app.get("/task_description")
    @guarded
    def task_description(id: int):
        return with_env(id, lambda e: e.env.get_task_description())

    @app.get("/object_tree")
    @guarded
    def object_tree(id: int):
        return with_env(id, lambda e: e.env.getObjectTree())

    @app.get("/look_around")
    @guarded
    def look_around(id: int):
        return with_env(id, lambda e: e.env.look())

    @app.get("/inventory")
    @guarded
    def inventory(id: int):
        return with_env(id, lambda e: e.env.inventory())

    @app.get("/valid_action_object_combinations")
    @guarded
    def valid_action_object_combinations(id: int):
        return with_env(id, lambda e: sorted(e.env.get_valid_action_object_combinations()))

    @app.get("/game_nums")
    @guarded
    def game_nums(id: int | None = None) -> dict:
        if not games:
            raise EnvError("the game list is read from the first environment: POST /create first")
        return {str(k): v for k, v in build_game_nums(games, task_names).items()}

    @app.post("/close")
    @guarded
    def close(body: IdBody):
        return table.close(body.id)

    return app


def main(argv: list[str] | None = None) -> None:
    serve(make_app, "sciworld", DEFAULT_PORT, DEFAULT_MAX_ENVS, argv)


if __name__ == "__main__":
    main()
