"""mcts_collection.py and its library entry point (search.collect_trees) as a
user runs them: trees of the selected tasks under {output_dir}/{TASK}/{model},
a manifest merged across runs, resume after a kill (a corrupt tree redone),
the model made only when a tree remains, exit 1 naming a failed task, exit 2 with one line for bad input or an
unreachable server, and every env var in --help."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_r import envs
from agent_r.manifest import load_manifest, write_manifest
from agent_r.search import SearchSettings, collect_trees
from agent_r.settings import parse
from agent_r.tree import NODE_KEYS, Node, leaf_paths, load_tree
from tests.support.doubles import ScriptedBackend
from tests.support.env_fixtures import ROOT
from tests.support.faults import files, script_env
from tests.support.search_doubles import seeded_textcraft_policy
from tests.support.search_runs import DOUBLE, SEARCH_ENV, collect, tree_files


def check_tree(path: Path, max_depth: int, server: str) -> Node:
    data = json.loads(path.read_text())
    stack = [data]
    while stack:  # exact keys, in order, on every node
        node = stack.pop()
        assert tuple(node) == NODE_KEYS
        stack.extend(node["children"])
    root = load_tree(path)
    assert (root.action, root.llm_response, root.obs, root.depth) == ("ROOT", "ROOT", "", 0)
    leaves = [p[-1] for p in leaf_paths(root)]
    assert leaves, "a searched tree has at least one terminal leaf"
    assert all(leaf.visits == 1 and leaf.value == leaf.env_score for leaf in leaves)
    assert root.value == pytest.approx(sum(leaf.env_score for leaf in leaves)) and root.visits == len(leaves)
    for node in root.iter_nodes():
        assert node.depth <= max_depth + 1
        if node.depth == max_depth + 1:
            assert node.is_terminal
        if node.children:
            assert node.is_terminal == all(c.is_terminal for c in node.children)
            assert node.visits == sum(c.visits for c in node.children)
    # recent_actions replay: reset + the stored actions reproduce every stored observation
    rules = envs.get_env("textcraft")
    with rules.make_client(server) as client:
        for leaf in leaves:
            client.reset(int(path.stem.rsplit("_", 1)[1]))
            assert leaf.state[3]["content"] == client.observe()
            for action, obs in leaf.recent_actions:
                out = client.step(action)
                assert obs == out.state.replace("\n", " ").replace("\t", " ")
    return root


def test_end_to_end_with_tiny_model(tmp_path, textcraft_server, tiny_model_dir):
    env = {"MAX_DEPTH": "2", "ITERA": "2", "N_GEN": "2", "MAX_TOKEN_LENGTH": "1024", "MODEL_DIR": tiny_model_dir}
    res = collect(tmp_path, textcraft_server, "--backend", "hf", "--min", "1", "--max", "2", "--max_new_tokens", "12",
                  env=env)
    assert res.returncode == 0, res.stderr
    folder = tmp_path / "textcraft" / Path(tiny_model_dir).name  # model name = basename of MODEL_DIR
    assert sorted(tree_files(folder)) == ["search_results_1.json"]
    for name in tree_files(folder):
        check_tree(folder / name, max_depth=2, server=textcraft_server)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["config"]["max_depth"] == 2 and manifest["config"]["n_gen"] == 2
    assert manifest["backend"]["backend"] == "hf" and manifest["versions"]["transformers"]
    assert manifest["started"] and manifest["finished"] and set(manifest["items"]) == {"1"}
    assert manifest["stats"]["done"] == 1 and manifest["stats"]["backend"]["calls"] > 0
    assert "trees: 1 done, 0 skipped, 0 failed" in res.stdout
    # rerun: nothing to do, nothing rewritten
    before = tree_files(folder)
    again = collect(tmp_path, textcraft_server, "--backend", "hf", "--min", "1", "--max", "2", env=env)
    assert again.returncode == 0 and "0 done, 1 skipped" in again.stdout
    assert tree_files(folder) == before


def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path, textcraft_server):
    flags = ["--backend", DOUBLE, "--model_name", "m", "--min", "0", "--max", "30", "--concurrency", "2"]
    reference = collect(tmp_path / "ref", textcraft_server, *flags, env=SEARCH_ENV)
    assert reference.returncode == 0, reference.stderr
    expected = tree_files(tmp_path / "ref" / "textcraft" / "m")
    assert len(expected) == 24

    folder = tmp_path / "run" / "textcraft" / "m"
    proc = collect(tmp_path / "run", textcraft_server, *flags, env={**SEARCH_ENV, "SEARCH_DOUBLE_SLEEP": "0.05"},
                   wait=False)
    deadline = time.monotonic() + 120
    while len(list(folder.glob("search_results_*.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    partial = tree_files(folder)
    assert 4 <= len(partial) < len(expected), "the kill should land mid-run"
    for name, data in partial.items():  # every tree file that exists is whole
        assert data == expected[name]
    # a corrupt tree (e.g. hand-edited) is reported and redone; a leftover temp file is ignored
    corrupt = sorted(partial)[0]
    (folder / corrupt).write_text('{"visits": 1')
    (folder / f".{corrupt}.abc.tmp").write_text("partial")
    rerun = collect(tmp_path / "run", textcraft_server, *flags, env=SEARCH_ENV)
    assert rerun.returncode == 0, rerun.stderr
    assert corrupt in rerun.stderr and "corrupt" in rerun.stderr and "searching the task of" in rerun.stderr
    assert "delete" not in rerun.stderr   # the search redoes it itself: no fix to ask of the user
    assert f"{len(expected) - len(partial) + 1} done, {len(partial) - 1} skipped" in rerun.stdout
    assert tree_files(folder) == expected


def test_failed_task_is_counted_and_exit_code_is_nonzero(tmp_path, textcraft_server):
    split = tmp_path / "split.json"
    split.write_text(json.dumps([{"item_id": "textcraft_1"}, -1, {"item_id": "textcraft_2"}]))
    res = collect(tmp_path, textcraft_server, "--backend", DOUBLE, "--model_name", "m", "--split_file", str(split),
                  "--min", "-5", env={"MAX_DEPTH": "1", "ITERA": "1", "N_GEN": "2"})
    assert res.returncode == 1
    assert "2 done, 0 skipped, 1 failed" in res.stdout and "failed tasks (rerun to retry): [-1]" in res.stdout
    assert "task -1 failed" in res.stderr
    assert sorted(tree_files(tmp_path / "textcraft" / "m")) == ["search_results_1.json", "search_results_2.json"]


@pytest.mark.parametrize("env,flags,message", [
    ({"TASK": "minecraft"}, [], "unknown TASK='minecraft'; choose one of: sciworld, textcraft, webshop"),
    ({"MAX_DEPTH": "deep"}, [], "MAX_DEPTH='deep' is not an integer: it is the depth beyond which a node is terminal"),
    ({"ITERA": "0"}, [], "ITERA=0 is too small: it is the number of MCTS iterations per tree"),
    ({"TEMP": "hot"}, [], "TEMP='hot' is not a number: it is the sampling temperature"),
    ({}, ["--min", "600"], "no tasks to search: indices in [600, end) of the 444 train tasks select none"),
    ({}, ["--concurrency", "0"], "--concurrency=0 is too small"),
    ({}, ["--split_file", "/nonexistent/split.json"], "split file /nonexistent/split.json does not exist"),
    ({"TASK": "webshop"}, [], "serves textcraft, not TASK=webshop"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, textcraft_server, env, flags, message):
    res = collect(tmp_path / "out", textcraft_server, "--backend", DOUBLE, "--model_name", "m", *flags, env=env)
    assert res.returncode == 2
    assert message in res.stderr and res.stderr.count("\n") == 1 and res.stderr.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_unreachable_server(tmp_path):
    from tests.support.env_fixtures import free_port

    url = f"http://127.0.0.1:{free_port()}"
    res = collect(tmp_path / "out", url, "--backend", DOUBLE, "--model_name", "m")
    assert res.returncode == 2 and f"cannot reach the env server at {url}" in res.stderr
    assert res.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_help_documents_every_env_var():
    res = subprocess.run([sys.executable, str(ROOT / "mcts_collection.py"), "--help"], cwd=ROOT, capture_output=True,
                         text=True, env=script_env())
    assert res.returncode == 0
    for name in ("TASK", "MAX_DEPTH", "ITERA", "N_GEN", "TEMP", "MAX_TOKEN_LENGTH", "MODEL_DIR", "MODEL_NAME",
                 "--concurrency", "--seed", "--split_file", "--task_num", "--task_iteration", "--output_dir"):
        assert name in res.stdout


def sciworld_policy_table(tmp_path: Path) -> str:
    table = tmp_path / "sciworld_policy.json"
    table.write_text(json.dumps({"default": ["Thought: look first.\nAction: look around",
                                             "Thought: go.\nAction: open door to kitchen"]}))
    return str(table)


def test_sciworld_short_search(tmp_path, sciworld_server):
    env = {"TASK": "sciworld", "MAX_DEPTH": "2", "ITERA": "1", "N_GEN": "2", "MODEL_DIR": sciworld_policy_table(tmp_path)}
    res = collect(tmp_path, sciworld_server, "--backend", "python:tests.support.doubles:table_backend",
                  "--model_name", "m", "--task_num", "1", "--task_iteration", "1", env=env)
    assert res.returncode == 0, res.stderr
    files = tree_files(tmp_path / "sciworld" / "m")
    assert len(files) == 1
    root = load_tree(tmp_path / "sciworld" / "m" / next(iter(files)))
    assert len(root.children) == 2 and root.state[3]["content"]
    deepest = max(root.iter_nodes(), key=lambda n: n.depth)
    assert deepest.depth == 3 and deepest.is_terminal
    assert all(isinstance(a, str) and a.startswith("(") for a in deepest.recent_actions)
    leaves = [p[-1] for p in leaf_paths(root)]
    assert root.value == pytest.approx(sum(leaf.env_score for leaf in leaves))


EXPERT = "python:tests.support.tree_fixtures:expert_or_mistake_backend"   # solves tasks: trees with successes


def test_collect_trees_resumes_and_records_its_run(tmp_path, textcraft_server):
    """The library entry point of mcts_collection.py: trees of the selected
    train tasks under {output_dir}/{TASK}/{model name} (the bundled model's
    name when MODEL_NAME is unset), the instruction file reaching the prompt,
    a manifest naming server, model and task count; a rerun searches nothing
    and a deleted tree is redone alone."""
    from agent_r.llm import BUNDLED_MODEL

    instruction = tmp_path / "instruction.txt"
    instruction.write_text("MY OWN INSTRUCTION: answer with Action: <action>.")
    env = {"TASK": "textcraft", "ITERA": "3", "MAX_DEPTH": "3", "N_GEN": "2",
           "AGENTENV_INSTRUCTION_FILE": str(instruction)}
    flags = ["--env_server_base", textcraft_server, "--output_dir", str(tmp_path / "out"), "--min", "1", "--max", "4",
             "--backend", EXPERT]
    folder = tmp_path / "out" / "textcraft" / BUNDLED_MODEL.name
    first = collect_trees(parse(SearchSettings, flags, env))         # the settings' own backend, made and closed
    assert (first.done, first.skipped, first.failed) == (3, 0, [])
    assert set(files(folder)) == {f"search_results_{i}.json" for i in (1, 2, 3)}
    assert first.out_dir == str(folder) and first.leaves > 0 and first.env_steps > 0
    root = json.loads((folder / "search_results_2.json").read_text())
    assert root["state"][1]["content"] == instruction.read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    config, items, stats = manifest["config"], manifest["items"], manifest["stats"]
    assert (config["env_server_base"], config["model_name"], config["indices"]) == \
        (textcraft_server, BUNDLED_MODEL.name, 3)
    assert set(items) == {"1", "2", "3"} and manifest["finished"] and manifest["backend"]["backend"]
    for key in ("leaves", "successful_leaves", "env_steps"):        # the summary adds up the trees
        assert getattr(first, key) == stats[key] == sum(item[key] for item in items.values()), key
    assert (stats["done"], stats["skipped"], stats["failed"]) == (3, 0, 0) and stats["backend"]["calls"] > 0
    assert sum(item["successful_leaves"] > 0 for item in items.values()) >= 2   # sums over trees, not the last

    idle = ScriptedBackend(seeded_textcraft_policy)
    again = collect_trees(parse(SearchSettings, flags, env), backend=idle)
    assert (again.done, again.skipped) == (0, 3) and idle.batches == []
    (folder / "search_results_2.json").unlink()
    redo = collect_trees(parse(SearchSettings, flags, env), backend=idle)
    assert (redo.done, redo.skipped) == (1, 2) and set(files(folder)) == {f"search_results_{i}.json" for i in (1, 2, 3)}


def test_manifest_records_run_and_merges_items_across_runs(tmp_path):
    path = tmp_path / "manifest.json"
    backend = ScriptedBackend(lambda m, i, s: "Action: inventory")
    write_manifest(path, {"seed": 3, "task": "textcraft"}, backend, {"done": 1}, 1_700_000_000.0, None,
                   {1: {"leaves": 2}, 10: {"leaves": 1}})
    first = json.loads(path.read_text())
    assert first["seed"] == 3 and first["backend"] == {"backend": "scripted"}
    assert first["finished"] is None and first["started"].startswith("2023-11-14T22:13:20")
    assert first["versions"]["python"] and "torch" in first["versions"]
    write_manifest(path, {"seed": 3}, None, {"done": 1}, 1_700_000_100.0, 1_700_000_200.0,
                   {2: {"leaves": 5}, 1: {"leaves": 3}})
    second = load_manifest(path)
    assert list(second["items"]) == ["1", "2", "10"]  # numeric order, earlier runs kept, newer wins
    assert second["items"]["1"] == {"leaves": 3} and second["items"]["10"] == {"leaves": 1}
    assert second["finished"] and second["backend"] is None


def test_unreadable_manifest_is_replaced(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("{not json")
    assert load_manifest(path) == {}
    write_manifest(path, {}, None, {}, 0.0, 1.0, {5: {}})
    assert load_manifest(path)["items"] == {"5": {}}


def test_the_model_loads_only_when_a_tree_remains(tmp_path, textcraft_server):
    """A rerun whose trees are all on disk never makes its backend (here one
    that cannot load: its policy table is missing) and exits 0; one tree more
    and the same backend is made, and its error is the run's one line."""
    flags = ["--model_name", "m", "--min", "1", "--max"]
    assert collect(tmp_path, textcraft_server, "--backend", DOUBLE, *flags, "3", env=SEARCH_ENV).returncode == 0
    broken = {**SEARCH_ENV, "MODEL_DIR": str(tmp_path / "missing.json")}
    table = "python:tests.support.doubles:table_backend"
    done = collect(tmp_path, textcraft_server, "--backend", table, *flags, "3", env=broken)
    assert done.returncode == 0 and "0 done, 2 skipped" in done.stdout
    more = collect(tmp_path, textcraft_server, "--backend", table, *flags, "4", env=broken)
    assert more.returncode == 2 and more.stderr.strip().splitlines()[-1].startswith("error: policy table")
    assert sorted(tree_files(tmp_path / "textcraft" / "m")) == ["search_results_1.json", "search_results_2.json"]
