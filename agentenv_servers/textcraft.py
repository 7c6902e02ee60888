"""TextCraft server, AgentGym-compatible (same endpoints and payloads as
agentenv-textcraft): ``python -m agentenv_servers.textcraft --port 36001``.

Each env is a ``TextCraftGame``; a reset builds a new one, so nothing grows
across resets and index -> task is the same in every process. Endpoints are
async: a step takes microseconds, so the event loop is cheaper than threads.
"""
from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from agentenv_servers.common import (EnvError, EnvTable, IdBody, ReplayBody, ResetBody, StepBody, add_health,
                                     check_replay, guarded, serve)
from agentenv_servers.textcraft_env import TextCraftGame, load_recipe_book

DEFAULT_PORT = 36001
DEFAULT_MAX_ENVS = 256


class CreateBody(BaseModel):
    commands: str | None = None   # a custom task: its crafting commands ...
    goal: str | None = None       # ... and goal item (both or neither)


def make_app(max_envs: int = DEFAULT_MAX_ENVS, replay: bool = True) -> FastAPI:
    book = load_recipe_book()
    table: EnvTable[TextCraftGame] = EnvTable(max_envs)
    app = FastAPI(title="TextCraft (Agent-R local server)")
    add_health(app, "textcraft", table)

    def payload(env_id: int, game: TextCraftGame) -> dict:
        return {"id": env_id, "observation": game.observation, "done": False, "reward": 0}

    @app.get("/")
    def hello():
        return "This is environment TextCraft."

    @app.get("/identity")
    def identity() -> dict:
        """What this server is, so clients can tell it from AgentGym's (which
        has no such endpoint): task index -> goal differs between the two."""
        return {"server": "agent-r", "env": "textcraft", "tasks": len(book.goals),
                "task_order": "goals by recipe depth, then item id"}

    @app.post("/create")
    @guarded
    async def create(body: CreateBody | None = None) -> dict:
        body = body or CreateBody()
        env_id = table.reserve()
        try:
            game = TextCraftGame(env_id, book, commands=body.commands, goal=body.goal)
        except Exception:
            table.close(env_id)
            raise
        table.put(env_id, game)
        return payload(env_id, game)

    def new_game(env_id: int, data_idx: int) -> TextCraftGame:
        table.get(env_id)
        if data_idx < 0:
            raise EnvError(f"data_idx must be >= 0, got {data_idx}")
        game = TextCraftGame(data_idx, book)
        table.put(env_id, game)
        return game

    @app.post("/reset")
    @guarded
    async def reset(body: ResetBody) -> dict:
        return payload(body.id, new_game(body.id, body.data_idx))

    @app.post("/step")
    @guarded
    async def step(body: StepBody) -> dict:
        obs, reward, done = table.get(body.id).step(body.action)
        return {"observation": obs, "reward": reward, "done": done}

    if replay:
        @app.post("/replay")
        @guarded
        async def replay_actions(body: ReplayBody) -> dict:
            """/reset and a /step of every action in one request (see common)."""
            check_replay(body)
            game = new_game(body.id, body.data_idx)
            out = payload(body.id, game)
            for action in body.actions:
                obs, reward, done = game.step(action)
                out = {"observation": obs, "reward": reward, "done": done}
            return {**out, "steps": len(body.actions)}

    @app.get("/observation")
    @guarded
    async def observation(id: int):
        return table.get(id).observation

    @app.get("/commands")
    @guarded
    async def commands(id: int):
        return table.get(id).commands

    @app.get("/goal")
    @guarded
    async def goal(id: int):
        return table.get(id).goal

    @app.get("/detail")
    @guarded
    async def detail(id: int) -> dict:
        game = table.get(id)
        return {"observation": game.observation, "done": game.done, "reward": float(game.done),
                "deleted": False, "goal": game.goal, "data_idx": game.data_idx,
                "inventory": dict(game.inventory)}

    @app.post("/close")
    @guarded
    async def close(body: IdBody):
        return table.close(body.id)

    return app


def main(argv: list[str] | None = None) -> None:
    serve(make_app, "textcraft", DEFAULT_PORT, DEFAULT_MAX_ENVS, argv)


if __name__ == "__main__":
    main()
