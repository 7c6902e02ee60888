"""How fast the tree viewer (agent_r/view.py) opens big trees in headless Chromium.

    .venv/bin/python -m bench.bench_viewer [--nodes 1000 5000 10000] [--obs_bytes 2048] [--tree FILE...]
    .venv/bin/python -m bench.bench_viewer --screenshot docs/img/viewer.png

Synthetic trees are grown like a search grows them (a random open node gets
N_GEN=4 children, deeper nodes picked more often, depth <= 12), with
observations of ``--obs_bytes`` and the full conversation state per node, and
written as real tree JSON; ``--tree`` measures given trees instead. Per tree:
the tree file, the page, the seconds to write the page (load_tree + HTML), and
in the browser the page's load time (navigation start to rendered, the page's
own clock), "expand all" (every row built) and one search.

``--screenshot`` writes the docs' picture instead: the hand-made fixture tree
of the viewer's tests with its revision data, a pair with a first bad step
selected and a leaf clicked.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from agent_r import paths, view  # noqa: E402
from agent_r.conversation import append_turn, initial_conversation  # noqa: E402
from agent_r.io import atomic_write_json  # noqa: E402
from agent_r.tree import Node  # noqa: E402
from tests.support.browser import chromium, missing, open_page  # noqa: E402

WORDS = "crafting table oak planks stick inventory could not find get craft using minecraft".split()


def synthetic_tree(nodes: int, obs_bytes: int, seed: int = 0, n_gen: int = 4, max_depth: int = 12) -> Node:
    rng = random.Random(seed)
    root = Node(state=initial_conversation("You are crafting items in Minecraft.", "Goal: craft a stick."))
    open_nodes, count = [root], 1
    while count < nodes and open_nodes:
        parent = max(rng.sample(open_nodes, min(2, len(open_nodes))), key=lambda n: n.depth)  # deeper first
        open_nodes.remove(parent)
        for _ in range(n_gen):
            action = f"{rng.choice(('get', 'craft'))} {rng.randint(1, 9)} {' '.join(rng.sample(WORDS, 3))}"
            obs = " ".join(rng.choice(WORDS) for _ in range(obs_bytes // 6))[:obs_bytes]
            turn = f"Thought: I try {action}.\nAction: {action}"
            child = parent.add_child(Node(obs=obs, llm_response=turn, depth=parent.depth + 1, action=action,
                                          recent_actions=parent.recent_actions + [[action, obs]],
                                          state=append_turn(parent.state, turn, obs)))
            count += 1
            (open_nodes if child.depth < max_depth else []).append(child)
    for node in reversed(list(root.iter_nodes())):      # leaves end; back up like the search
        if not node.children and rng.random() < 0.7:
            node.is_terminal, node.env_score = True, float(rng.random() < 0.2)
            walk = node
            while walk is not None:
                walk.visits, walk.value, walk = walk.visits + 1, walk.value + node.env_score, walk.parent
    return root


def measure(driver, tree: Path, out: Path) -> dict:
    started = time.perf_counter()
    info = view.write_tree_page(tree, out, None)
    written = time.perf_counter() - started
    load_ms = open_page(driver, out)
    expand_ms = driver.execute_script(
        "const t = performance.now(); document.getElementById('expand-all').click(); return performance.now() - t")
    rows = driver.execute_script("return document.querySelectorAll('li.node').length")
    assert rows == info["nodes"], (rows, info["nodes"])
    search_ms = driver.execute_script(
        "const t = performance.now(); search('stick'); return performance.now() - t")
    return {"nodes": info["nodes"], "max depth": info["max_depth"], "tree MB": tree.stat().st_size / 1e6,
            "page MB": out.stat().st_size / 1e6, "write s": written, "load ms": load_ms,
            "expand all ms": expand_ms, "search ms": search_ms}


def screenshot(path: Path) -> None:
    from tests.support import tree_fixtures as tf
    from tests.support.viewer_fixtures import IDS, write_viewer_run

    with tempfile.TemporaryDirectory() as tmp:
        tree, jsonl = write_viewer_run(Path(tmp), root=tf.tree_many_leaves())
        page = Path(tmp) / "tree.html"
        view.write_tree_page(tree, page, view.read_revisions([str(jsonl)]))
        with chromium(1280, 1100) as driver:
            open_page(driver, page)
            pairs = driver.execute_script("return D.pairs.map(p => p.first_bad)")
            driver.find_elements("css selector", "#pairs .pair")[pairs.index(IDS["get 1 diamond"])].click()
            driver.find_element("css selector", f'li[data-node-id="{IDS["get 1 diamond"]}"] .action').click()
            driver.save_screenshot(str(path))
    from PIL import Image   # a 256-colour palette keeps the committed picture small

    with Image.open(path) as image:
        image.convert("RGB").quantize(256).save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} KB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    p.add_argument("--obs_bytes", type=int, default=2048)
    p.add_argument("--tree", nargs="+", default=[], help="measure these tree files instead")
    p.add_argument("--screenshot", help="write the docs' screenshot to this PNG and exit")
    args = p.parse_args()
    if missing():
        sys.exit(missing())
    if args.screenshot:
        screenshot(Path(args.screenshot))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp, chromium() as driver:
        trees = [Path(t) for t in args.tree]
        for n in ([] if trees else args.nodes):
            trees.append(paths.tree_file(tmp, n))
            atomic_write_json(trees[-1], synthetic_tree(n, args.obs_bytes).to_dict(), indent=None)
        for i, tree in enumerate(trees):
            results.append(measure(driver, tree, Path(tmp) / f"page_{i}.html"))
            print(f"measured {tree.name}", file=sys.stderr)
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")


if __name__ == "__main__":
    main()
