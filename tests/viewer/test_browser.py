"""The tree viewer in a real headless Chromium (tests/support/browser.py):
counts, leaf colours, the highlighted revision pair with its first-bad and
splice markers, the training sample's loss turns, expand/collapse, search and
the conversation of a leaf, on a hand-made tree with known answers and on
trees of real searches against the local TextCraft server. Every wait is on a
condition in the page, never on the clock. A screenshot of each page is saved
under the test's tmp_path.

Without Chromium (`make setup-browser` installs it) these tests skip, saying
why; under CI (CI=true), where `make test` installs it, they fail instead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r import view
from agent_r.revision_data import PathSettings, collect
from agent_r.tree import Node, leaf_paths, load_tree
from tests.support import tree_fixtures as tf
from tests.support.browser import chromium, missing, open_page
from tests.support.doubles import ScriptedBackend
from tests.support.env_fixtures import ROOT
from tests.support.viewer_fixtures import (FAILED_LEAVES, HOSTILE_OBS, IDS, SUCCESS_LEAVES, expected_pair,
                                           write_viewer_run)


TIMEOUT = 30


@pytest.fixture(scope="module")
def browser():
    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests (make test runs make setup-browser): {reason}")
        pytest.skip(reason)
    with chromium() as driver:
        yield driver


def wait(driver, condition, timeout: float = TIMEOUT):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: condition(d))


def ids(driver, css: str, shown_only: bool = False) -> set[int]:
    from selenium.webdriver.common.by import By

    return {int(e.get_attribute("data-node-id")) for e in driver.find_elements(By.CSS_SELECTOR, css)
            if not shown_only or e.is_displayed()}


def count(driver, key: str) -> int:
    return int(driver.find_element("id", f"count-{key}").get_attribute("data-value"))


def click_node(driver, node_id: int) -> None:
    driver.find_element("css selector", f'li[data-node-id="{node_id}"] > .line > .action').click()


def expand_all(driver, nodes: int) -> None:
    driver.find_element("id", "expand-all").click()
    wait(driver, lambda d: len(d.find_elements("css selector", "li.node")) == nodes)


def screenshot(driver, path: Path) -> None:
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 5_000


def background(driver, css: str) -> tuple[int, ...]:
    value = driver.find_element("css selector", css).value_of_css_property("background-color")
    return tuple(int(x) for x in value[value.index("(") + 1:-1].split(",")[:3])


def test_fixture_tree_with_revisions(tmp_path, browser):
    from selenium.webdriver.common.keys import Keys

    tree, jsonl = write_viewer_run(tmp_path)
    rows = [json.loads(line) for line in jsonl.read_text().split("\n") if line]
    page = tmp_path / "tree.html"
    assert view.main([str(tree), "--revisions", str(jsonl), "-o", str(page)]) == 0
    d = browser
    open_page(d, page)
    assert (count(d, "nodes"), count(d, "leaves"), count(d, "successes"), count(d, "pairs")) == (10, 7, 2, len(rows))
    assert len(d.find_elements("css selector", "#pairs .pair")) == len(rows)

    # the first pair is selected on load: its paths, splice and the sample are marked
    first = expected_pair(rows[0])
    assert ids(d, ".path-high") == set(first["high"]) and ids(d, ".path-low") == set(first["low"])
    assert ids(d, ".splice-point") == {first["splice"]}

    # choose the pair whose low path has a Bad second step
    i = next(k for k, row in enumerate(rows) if expected_pair(row)["first_bad"] == IDS["get 1 diamond"])
    want = expected_pair(rows[i])
    d.find_element("css selector", f'#pairs .pair[data-pair="{i}"]').click()
    wait(d, lambda d: ids(d, ".first-bad") == {IDS["get 1 diamond"]})
    assert ids(d, ".path-high") == set(want["high"]) and ids(d, ".path-low") == set(want["low"])
    assert ids(d, ".splice-point") == {want["splice"]}
    badge = d.find_element("css selector", ".first-bad .badge-first-bad").text
    assert badge == "first bad step (2)"
    sample = rows[i]["revise_log"]
    assert len(d.find_elements("css selector", "#sample > li")) == len(sample)
    trained = [m for m in sample if m["role"] == "assistant" and m.get("loss") is not False]
    untrained = [m for m in sample if m["role"] == "assistant" and m.get("loss") is False]
    assert len(d.find_elements("css selector", "#sample .turn-loss")) == len(trained) >= 2
    assert len(d.find_elements("css selector", "#sample .turn-noloss")) == len(untrained) >= 2
    assert background(d, "#sample .turn-loss") != background(d, "#sample .turn-noloss")
    revision = d.find_elements("css selector", "#sample .revision-turn")
    assert len(revision) == 1 and "Action: wait" in revision[0].text

    # leaves: every one rendered after "expand all", success and failure coloured apart
    expand_all(d, 10)
    assert ids(d, ".leaf-success") == SUCCESS_LEAVES and ids(d, ".leaf-fail") == FAILED_LEAVES
    green, red = background(d, ".leaf-success > .line"), background(d, ".leaf-fail > .line")
    assert green != red and green[1] > green[0] and red[0] > red[1]

    # collapse and expand one node
    node = IDS["get 1 oak log"]
    toggle = d.find_element("css selector", f'li[data-node-id="{node}"] > .line > .toggle')
    toggle.click()
    wait(d, lambda d: not ids(d, f'li[data-node-id="{node}"] li.node', shown_only=True))
    toggle.click()
    wait(d, lambda d: ids(d, f'li[data-node-id="{node}"] li.node', shown_only=True) == {2, 3, 4})

    # search filters to the matches and their ancestors, highlighted
    box = d.find_element("id", "search")
    box.send_keys("diamond")
    wait(d, lambda d: d.find_element("id", "search-status").get_attribute("data-matches") == "1")
    assert ids(d, "li.node", shown_only=True) == {0, IDS["get 1 oak log"], IDS["get 1 diamond"]}
    assert ids(d, ".match") == {IDS["get 1 diamond"]}
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)
    wait(d, lambda d: d.find_element("id", "search-status").get_attribute("data-matches") == "0")
    assert {1, 5, 6, 7, 9} <= ids(d, "li.node", shown_only=True)

    # a leaf shows its conversation, root to leaf
    click_node(d, 2)
    wait(d, lambda d: "leaf 2" in d.find_element("id", "conv-title").text)
    messages = d.find_elements("css selector", "#conversation > li")
    assert len(messages) == 4 + 2 * 2
    assert messages[-1].find_element("css selector", ".msg-body").text == "Crafted 4 minecraft:oak_planks"
    assert messages[-2].find_element("css selector", ".msg-body").text == tf.turn_text(
        "craft 4 oak planks using 1 oak log")

    # the observation holding '</script>' is shown as text, never run
    click_node(d, IDS["look </script><b>"])
    full = d.execute_script("return document.querySelector('#node-detail .full-obs').textContent")
    assert full == HOSTILE_OBS and d.execute_script("return document.body.dataset.pwned") is None
    click_node(d, IDS["get 1 diamond"])
    screenshot(d, tmp_path / "viewer.png")


def search(tmp_path: Path, server: str, backend: str, tasks: range, **env) -> Path:
    """mcts_collection.py as a user runs it; returns the trees' folder."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "TASK": "textcraft", "LOGLEVEL": "WARNING", "MODEL_NAME": "m",
            **{k: str(v) for k, v in env.items()}}
    res = subprocess.run([sys.executable, str(ROOT / "mcts_collection.py"), "--env_server_base", server,
                          "--output_dir", str(tmp_path / "mcts_result"), "--backend", backend,
                          "--min", str(tasks.start), "--max", str(tasks.stop)],
                         cwd=tmp_path, env=full, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp_path / "mcts_result" / "textcraft" / "m"


def test_tree_of_a_tiny_model_search(tmp_path, browser, textcraft_server, tiny_model_dir):
    trees = search(tmp_path, textcraft_server, "hf", range(1, 2), MODEL_DIR=tiny_model_dir, MAX_DEPTH=3,
                   ITERA=3, N_GEN=3, MAX_TOKEN_LENGTH=1024)
    tree = trees / "search_results_1.json"
    root = load_tree(tree)
    nodes = list(root.iter_nodes())
    leaves = [p[-1] for p in leaf_paths(root)]
    page = tmp_path / "tree.html"
    assert view.main([str(tree), "-o", str(page)]) == 0
    d = browser
    open_page(d, page)
    assert (count(d, "nodes"), count(d, "leaves")) == (len(nodes), len(leaves))
    assert count(d, "successes") == sum(leaf.env_score >= 1 for leaf in leaves)
    expand_all(d, len(nodes))
    index = {id(n): i for i, n in enumerate(nodes)}
    assert ids(d, ".leaf-success") == {index[id(x)] for x in leaves if x.env_score >= 1}
    assert ids(d, ".leaf-fail") == {index[id(x)] for x in leaves if x.env_score < 1}
    for i, node in enumerate(nodes):   # each row says its node's action and numbers
        line = d.find_element("css selector", f'li[data-node-id="{i}"] > .line')
        assert line.find_element("css selector", ".action").get_attribute("textContent") == node.action
        assert f"n={node.visits} " in line.find_element("css selector", ".stats").text
    screenshot(d, tmp_path / "tiny_model_tree.png")


def node_path(root: Node, log: list[dict]) -> list[Node]:
    """The nodes a stored conversation walks, found child by child (test oracle)."""
    path, node = [], root
    body = log[4:]
    for turn, obs in zip(body[0::2], body[1::2]):
        node = next(c for c in node.children if c.state[-2]["content"] == turn["content"]
                    and c.state[-1]["content"] == obs["content"])
        path.append(node)
    return path


def test_run_folder_of_a_real_search_with_revision_data(tmp_path, browser, textcraft_server):
    """A search whose policy double plays the expert's step or a useless
    `inventory` (so trees have successes and failures), revision data whose
    scripted verifier calls `inventory` Bad, then the folder's index and a page."""
    trees = search(tmp_path, textcraft_server, "python:tests.support.tree_fixtures:expert_or_mistake_backend",
                   range(0, 3), MAX_DEPTH=3, ITERA=4, N_GEN=2)
    verifier = ScriptedBackend(tf.verifier_policy({"inventory": "Bad"}))
    data = collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(tmp_path / "data")), verifier)
    rows = [json.loads(line) for line in data.output.read_text().split("\n") if line]
    assert rows
    out = tmp_path / "pages"
    assert view.main([str(trees), "--revisions", str(data.output), "-o", str(out)]) == 0
    d = browser
    d.get((out / "index.html").as_uri())
    links = d.find_elements("css selector", "#trees a")
    assert len(links) == len(list(trees.glob("search_results_*.json")))
    idx = rows[0]["task_num"]
    d.find_element("css selector", f'#trees a[href="search_results_{idx}.html"]').click()
    wait(d, lambda d: d.execute_script("return document.body && document.body.dataset.ready === 'true'"))

    root = load_tree(trees / f"search_results_{idx}.json")
    nodes = {id(n): i for i, n in enumerate(root.iter_nodes())}
    mine = [r for r in rows if r["task_num"] == idx]
    assert count(d, "pairs") == len(mine) and count(d, "nodes") == len(nodes)
    for k, row in enumerate(mine):
        d.find_element("css selector", f'#pairs .pair[data-pair="{k}"]').click()
        high, low = node_path(root, row["high_log"]), node_path(root, row["low_log"])
        wait(d, lambda d: ids(d, ".path-high") == {nodes[id(n)] for n in high})
        assert ids(d, ".path-low") == {nodes[id(n)] for n in low}
        bad = next((n for n in low if n.action == "inventory"), None)    # the verifier's first Bad
        assert ids(d, ".first-bad") == ({nodes[id(bad)]} if bad else set())
        prefix = low[:low.index(bad) + 1] if bad else low
        turn = lambda n: n.state[-2]["content"]  # noqa: E731
        resume = next((j for j, n in enumerate(high) if j >= len(prefix) or turn(n) != turn(prefix[j])), None)
        assert ids(d, ".splice-point") == ({nodes[id(high[resume])]} if resume is not None else set())
        flags = [m.get("loss") for m in row["revise_log"] if m["role"] == "assistant"]
        assert len(d.find_elements("css selector", "#sample .turn-noloss")) == flags.count(False)
    screenshot(d, tmp_path / "real_tree.png")
