"""Evaluation runs as the evaluation tests make them: settings for a scripted
run against a local env server (``config``, ``split_file``), policies that
solve or loop (``expert_or_loop``), the result files a run wrote
(``read_results``), eval.py as a subprocess (``run_eval``), and stored
trajectories (``trajectory``)."""
import json
import os
import subprocess
import sys

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import paths
from agent_r.knobs import BackendSettings
from agentenv_servers.textcraft_expert import solve
from tests.support.env_fixtures import ROOT


def split_file(tmp_path, indices, task="textcraft"):
    path = tmp_path / f"split_{'_'.join(map(str, indices))}.json"
    path.write_text(json.dumps([{"item_id": f"{task}_{i}"} for i in indices]))
    return str(path)


def model_turns(messages):
    return sum(1 for m in messages[conv.HEAD_LEN:] if m["role"] == "assistant")


def expert_or_loop(solve_indices_goals):
    """Follows the expert plan when the goal is one of ``solve_indices_goals``,
    else asks for the inventory forever (a loop of period 1)."""

    def policy(messages, i, seed):
        task_obs = messages[conv.HEAD_LEN - 1]["content"]
        plan = solve(task_obs)
        if plan.goal in solve_indices_goals:
            k = model_turns(messages)
            return plan.steps[k].turn() if k < len(plan.steps) else "Action: inventory"
        return "Thought: let me check.\nAction: inventory"

    return policy


def goal_of(idx):
    from agentenv_servers.textcraft_env import TextCraftGame

    game = TextCraftGame(idx)
    return solve(game.observation).goal, len(solve(game.observation).steps)


def config(tmp_path, url, split, **kw):
    base = dict(task="textcraft", backend=BackendSettings(model_name="scripted"), model_type="eval",
                output_dir=str(tmp_path / "out"), env_server_base=url, split_file=split, max_steps=4, concurrency=2,
                max_token_length=100000, env_retry_delay=0.0)
    base.update(kw)
    return ev.EvalSettings(**base)


def read_results(cfg):
    return {p.name: json.loads(p.read_text()) for p in sorted(paths.eval_dir(cfg).glob("search_results_*.json"))}


def run_eval(args, env=None, wait=True, **popen):
    full_env = {**os.environ, "LOGLEVEL": "WARNING", **(env or {})}
    cmd = [sys.executable, str(ROOT / "eval.py"), *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300, **popen)


def trajectory(actions: list[str]) -> list[dict]:
    state = conv.initial_conversation("instr", "Goal: craft stick.")
    for a in actions:
        state = conv.append_turn(state, f"Thought: go.\nAction: {a}", "obs")
    return state
