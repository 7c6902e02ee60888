"""Env-server faults with real processes: the local TextCraft server is killed
mid-run and restarted on the same port, or stays down; the search and eval
runs restart the trees and episodes caught in flight from their root on a
fresh env, a bounded number of times. Each test owns its server, so a kill
or a live-env count is its own.

No sleeps race the clock: every run that is disturbed mid-way is held at a
known point by a gate (tests/support/faults.py ``Gate``) - e.g. "before the
first model call after the 3rd tree file" - and the test kills the server
while the run stands there, then releases it."""
from __future__ import annotations

import json

from agent_r.tree import load_tree
from tests.servers.killable import crash_and_restart
from tests.support.faults import (GATED, SEARCH_DOUBLE, SEARCH_INNER, TABLE_INNER, Gate, files, kill, live_envs,
                                  run_script, start_server_on)

SEARCH_ENV = {"TASK": "textcraft", "MAX_DEPTH": "3", "ITERA": "3", "N_GEN": "3"}


def test_search_survives_a_server_restart(tmp_path, own_server):
    """Trees in flight when the server dies restart from their root on a fresh
    env; the run finishes (exit 0) with exactly the undisturbed run's trees.
    The run is held after its 3rd tree (4 trees in flight, waiting for the
    model) while the server is killed and restarted."""
    url = own_server["url"]
    flags = ["--env_server_base", url, "--backend", GATED, "--model_name", "m", "--min", "0", "--max", "25",
             "--concurrency", "4"]
    ref = run_script("mcts_collection.py", *flags, "--output_dir", tmp_path / "ref",
                     env={**SEARCH_ENV, **Gate(tmp_path / "g0").env(SEARCH_INNER)})
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = files(tmp_path / "ref" / "textcraft" / "m")
    assert len(expected) == 20

    folder = tmp_path / "run" / "textcraft" / "m"
    gate = Gate(tmp_path / "gate")
    proc = run_script("mcts_collection.py", *flags, "--output_dir", tmp_path / "run", wait=False,
                      env={**SEARCH_ENV, **gate.env(SEARCH_INNER, files=(folder / "search_results_*.json", 3))})
    gate.wait(proc)
    assert live_envs(url) == 4                   # every tree in flight holds an env on the server
    crash_and_restart(own_server)
    gate.release()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert err.count("restarting it on a fresh env") >= 4  # each tree caught mid-flight restarted
    assert files(folder) == expected          # same trees, none partial, none lost
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sum(item["env_restarts"] for item in manifest["items"].values()) >= 4
    assert live_envs(own_server["url"]) == 0


def test_eval_survives_a_server_restart(tmp_path, own_server):
    """Episodes in flight when the server dies restart on a fresh env; the eval
    run finishes with exactly the undisturbed run's result files. The run is
    held after its first result (4 episodes in flight) while the server is
    killed and restarted."""
    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"Inventory: You are not": ["Thought: t\nAction: get 1 stick"],
                                 "default": ["Thought: t\nAction: inventory"]}))
    env = {"TASK": "textcraft", "MODEL_DIR": table, "MODEL_NAME": "table", "TEMP": "0"}
    flags = ["--env_server_base", own_server["url"], "--backend", GATED, "--limit", "8", "--max_steps", "15",
             "--concurrency", "4", "--env_retry_delay", "0.1"]
    ref = run_script("eval.py", *flags, "--output_dir", tmp_path / "ref",
                     env={**env, **Gate(tmp_path / "g0").env(TABLE_INNER)})
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = files(tmp_path / "ref" / "textcraft" / "table_eval")
    assert len(expected) == 8

    run_dir = tmp_path / "run" / "textcraft" / "table_eval"
    gate = Gate(tmp_path / "gate")
    proc = run_script("eval.py", *flags, "--output_dir", tmp_path / "run", wait=False,
                      env={**env, **gate.env(TABLE_INNER, files=(run_dir / "search_results_*.json", 1))})
    gate.wait(proc)
    assert live_envs(own_server["url"]) == 4
    crash_and_restart(own_server)
    gate.release()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "env error" in err and err.count("restarting it on a fresh env") >= 4
    assert files(run_dir) == expected
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"] == 8 and summary["failed"] == 0
    assert live_envs(own_server["url"]) == 0


def test_search_stops_with_one_line_when_the_server_stays_down(tmp_path, own_server):
    """Dead for good: trees retry (bounded), then the run stops with exit 2 and
    the unreachable message; the trees finished before are kept and a rerun,
    once the server is back, completes the set. The server is killed while
    the run is held after its 2nd tree."""
    url = own_server["url"]
    flags = ["--env_server_base", url, "--backend", SEARCH_DOUBLE, "--model_name", "m", "--min", "0", "--max", "12",
             "--concurrency", "2", "--env_retry_delay", "0.1"]
    folder = tmp_path / "textcraft" / "m"
    gate = Gate(tmp_path / "gate")
    gated = [*flags[:3], GATED, *flags[4:]]
    proc = run_script("mcts_collection.py", *gated, "--output_dir", tmp_path, wait=False,
                      env={**SEARCH_ENV, **gate.env(SEARCH_INNER, files=(folder / "search_results_*.json", 2))})
    gate.wait(proc)
    kill(own_server["proc"])
    gate.release()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: cannot reach the textcraft environment server")
    kept = files(folder)
    assert len(kept) >= 2 and all(load_tree(folder / name) for name in kept)

    own_server["proc"] = start_server_on("agentenv_servers.textcraft", own_server["port"])
    rerun = run_script("mcts_collection.py", *flags, "--output_dir", tmp_path, env=SEARCH_ENV)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert len(files(folder)) == 9 and all(files(folder)[name] == data for name, data in kept.items())


# ---- the retry rule itself, in process (no timing involved) -----------------

def search_with_flaky_clients(server: str, fail_on_steps: list[int | None], retries: int = 2):
    """Search task 1; the k-th client made raises an env error on its
    ``fail_on_steps[k]``-th step (None: never; clients past the list: never)."""
    from agent_r import envs
    from agent_r.search import SearchSettings, search_trees
    from agentenv_client import EnvServerError
    from tests.support.search_doubles import SeededTextCraftDouble

    rules = envs.get_env("textcraft")
    made = []

    def make_client():
        client = rules.make_client(server)
        limit = fail_on_steps[len(made)] if len(made) < len(fail_on_steps) else None
        real_step, count = client.step, [0]

        def step(action):
            count[0] += 1
            if limit is not None and count[0] >= limit:
                raise EnvServerError("injected: the server forgot this env")
            return real_step(action)

        client.step = step
        made.append(client)
        return client

    results = []
    cfg = SearchSettings(max_depth=3, iterations=3, n_gen=3, env_retries=retries, env_retry_delay=0.0, concurrency=1)
    search_trees([1], rules, make_client, SeededTextCraftDouble(), cfg, on_tree=results.append)
    return results[0], made


def test_tree_restarted_from_root_equals_the_undisturbed_tree(textcraft_server):
    """A tree whose env fails twice mid-search is restarted from its root on a
    new client each time and comes out byte-identical to the undisturbed tree;
    every failed client is closed."""
    clean, _ = search_with_flaky_clients(textcraft_server, [])
    flaky, made = search_with_flaky_clients(textcraft_server, [5, 2])
    assert clean.error is None and flaky.error is None
    assert flaky.job.stats.env_restarts == 2 and len(made) == 3
    assert json.dumps(flaky.result.to_dict()) == json.dumps(clean.result.to_dict())
    assert all(c._closed for c in made)          # the failed clients were closed too


def test_tree_fails_after_the_bounded_restarts(textcraft_server):
    """An env that always fails: the tree gives up after env_retries restarts
    with the env's error, every client closed."""
    res, made = search_with_flaky_clients(textcraft_server, [1, 1, 1, 1], retries=2)
    assert res.result is None and "injected" in str(res.error)
    assert res.job.stats.env_restarts == 2 and len(made) == 3 and all(c._closed for c in made)
