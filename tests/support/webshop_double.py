"""WebShopServerDouble: a protocol-level test double of AgentGym's WebShop
server (the real one needs WebShop's product data and search index, which cannot
be downloaded here). It speaks the same endpoints and payloads with a tiny fake
catalogue, and can misbehave on purpose:

* ``--busy N`` (or POST /_busy {"n": N} at any time, a control endpoint the
  real server does not have): the next N POST /step requests answer HTTP 503;
* ``--malformed``: every answer is a body that is not JSON.

Run as ``python -m tests.support.webshop_double --port N [--busy N] [--malformed]``.
"""
from __future__ import annotations

import argparse

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

PRODUCTS = {"B01": "red cotton shirt", "B02": "blue wool scarf", "B03": "green rain jacket"}


class ResetQuery(BaseModel):
    env_idx: int
    session_id: int | None = None


class StepQuery(BaseModel):
    env_idx: int
    action: str


class CloseQuery(BaseModel):
    env_idx: int


class Busy(BaseModel):
    n: int


def make_app(busy: int = 0, malformed: bool = False) -> FastAPI:
    app = FastAPI(title="WebShopServerDouble")
    envs: dict[int, dict] = {}
    state = {"next": 100, "busy_left": busy}

    @app.middleware("http")
    async def garble(request: Request, call_next):
        if malformed and request.url.path != "/health":
            return PlainTextResponse("<html>not json{", status_code=200)
        return await call_next(request)

    def target(env: dict) -> str:
        return sorted(PRODUCTS)[(env["session"] or 0) % len(PRODUCTS)]

    def page(env: dict) -> str:
        want = PRODUCTS[target(env)]
        head = f"WebShop [SEP] Instruction: [SEP] i need a {want} [SEP] "
        if env["page"] == "search":
            return head + "Search"
        if env["page"] == "results":
            return head + "Back to Search [SEP] " + " [SEP] ".join(f"{k} [SEP] {v}" for k, v in sorted(PRODUCTS.items()))
        return head + f"Back to Search [SEP] {PRODUCTS[env['page']]} [SEP] Buy Now"

    @app.post("/_busy")
    def set_busy(q: Busy):
        state["busy_left"] = q.n
        return {"busy_left": q.n}

    @app.get("/health")
    def health():
        return {"status": "ok", "env": "webshop-double", "busy_left": state["busy_left"]}

    @app.post("/create")
    def create() -> int:
        env_id = state["next"]
        state["next"] += 7          # ids are not 0, 1, 2 in the real server either
        envs[env_id] = {"session": None, "page": "search"}
        return env_id

    @app.post("/reset")
    def reset(q: ResetQuery):
        env = envs[q.env_idx]       # unknown id -> HTTP 500, as in the real server
        env.update(session=q.session_id, page="search")
        return [page(env), None]

    @app.get("/observation")
    def observation(env_idx: int) -> str:
        return page(envs[env_idx])

    @app.post("/step")
    def step(q: StepQuery):
        if state["busy_left"] > 0:
            state["busy_left"] -= 1
            return JSONResponse({"detail": "busy"}, status_code=503)
        env = envs[q.env_idx]
        action = q.action.strip()
        reward, done = 0.0, False
        if action.startswith("search[") and env["page"] == "search":
            env["page"] = "results"
        elif action.startswith("click[") and action.endswith("]"):
            value = action[6:-1]
            if value in PRODUCTS and env["page"] == "results":
                env["page"] = value
            elif value.lower() == "buy now" and env["page"] in PRODUCTS:
                reward, done = (1.0 if env["page"] == target(env) else 0.0), True
            elif value.lower() == "back to search":
                env["page"] = "search"
        return {"state": page(env), "reward": reward, "done": done, "info": None}

    @app.post("/close")
    def close(q: CloseQuery):
        return {"closed": envs.pop(q.env_idx, None) is not None}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--malformed", action="store_true")
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(make_app(args.busy, args.malformed), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
