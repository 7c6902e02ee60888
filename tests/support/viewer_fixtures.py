"""Trees and revision data with known answers for the viewer's tests.

``viewer_tree`` is tree_fixtures' many-leaves tree plus one failed leaf whose
action and observation try to break out of the page's JSON <script>. Node ids
are the pre-order positions the viewer gives them (the root is 0). Revision
data comes from the real ``revision_data.collect`` with a scripted verifier
(a test double) that judges two actions Bad, so first bad steps are known.
"""
from __future__ import annotations

from pathlib import Path

from agent_r.revision_data import PathSettings, collect
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend

HOSTILE_ACTION = "look </script><b>"
HOSTILE_OBS = "</script><script>document.body.dataset.pwned = '1'</script> & <!-- \u2028 \"quoted\""
BAD_ACTIONS = ("get 1 diamond", "get 1 dirt")

# pre-order ids of viewer_tree()
IDS = {"get 1 oak log": 1, "craft 4 oak planks using 1 oak log": 2, "get 1 diamond": 3, "get 1 gold": 4,
       "get 4 stick": 5, "inventory": 6, "get 1 dirt": 7, "get 2 dirt": 8, HOSTILE_ACTION: 9}
SUCCESS_LEAVES = {2, 5}
FAILED_LEAVES = {3, 4, 6, 8, 9}


def viewer_tree():
    root = tf.make_root()
    a = tf.add_step(root, "get 1 oak log", "Got 1 oak log")
    tf.add_step(a, "craft 4 oak planks using 1 oak log", "Crafted 4 minecraft:oak_planks", score=1)
    tf.add_step(a, "get 1 diamond", "Could not find diamond", score=0)
    tf.add_step(a, "get 1 gold", "Could not find gold", score=0)
    tf.add_step(root, "get 4 stick", "Got 4 stick", score=1)
    tf.add_step(root, "inventory", "Inventory: ", score=0)
    z = tf.add_step(root, "get 1 dirt", "Got 1 dirt")
    tf.add_step(z, "get 2 dirt", "Got 2 dirt", score=0)
    tf.add_step(root, HOSTILE_ACTION, HOSTILE_OBS, score=0)
    return tf.backup(root)


def write_viewer_run(folder: Path, idx: int = 7, root=None) -> tuple[Path, Path]:
    """(tree file, revision JSONL) under ``folder``, laid out as the scripts do;
    the tree is ``viewer_tree()`` unless ``root`` is given."""
    trees = folder / "mcts_result" / "textcraft" / "m"
    tree = tf.write_tree(root or viewer_tree(), trees, idx)
    verifier = ScriptedBackend(tf.verifier_policy({a: "Bad" for a in BAD_ACTIONS}))
    result = collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(folder / "data")), verifier)
    assert result.rows > 0, result.report()
    return tree, result.output


def expected_pair(row: dict) -> dict:
    """What the page must mark for a row of viewer_tree's data (worked out by hand)."""
    steps = lambda log: [m["content"].split("Action: ")[1] for m in log[4:] if m["role"] == "assistant"]  # noqa: E731
    high, low = steps(row["high_log"]), steps(row["low_log"])
    first_bad = next((i + 1 for i, a in enumerate(low) if a in BAD_ACTIONS), None)
    if high[0] == "get 4 stick":
        splice = IDS["get 4 stick"]                # shares no step with any low path
    elif low[0] == "get 1 oak log":
        splice = IDS["craft 4 oak planks using 1 oak log"]   # diverges after the shared step A
    else:
        splice = IDS["get 1 oak log"]
    return {"high": [IDS[a] for a in high], "low": [IDS[a] for a in low], "splice": splice,
            "first_bad": None if first_bad is None else IDS[low[first_bad - 1]], "first_bad_step": first_bad}
