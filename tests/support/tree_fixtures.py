"""Hand-built search trees with known leaf scores, for revision-data tests.

Trees are built with the real ``agent_r.tree.Node`` and the real conversation
helpers, then backed up the way the search does it (every leaf: visits 1,
value = its score; the root's value = the sum of leaf scores), so they are what
mcts_collection.py would write for these turns.
"""
from __future__ import annotations

import re
from pathlib import Path

from agent_r.conversation import append_turn, clean_observation, initial_conversation
from agent_r.io import atomic_write_json
from agent_r.tree import Node

INSTRUCTION = "You are in Minecraft. Reply as 'Thought: ...\\nAction: ...'. Actions: get, craft, inventory."
TASK = "Crafting commands:\ncraft 4 oak planks using 1 oak log\ncraft 4 stick using 2 oak planks\n\nGoal: craft stick."


def make_root(task: str = TASK) -> Node:
    return Node(state=initial_conversation(INSTRUCTION, task))


def turn_text(action: str) -> str:
    return f"Thought: next I {action}.\nAction: {action}"


def add_step(parent: Node, action: str, obs: str, score: float | None = None, disaster: bool = False) -> Node:
    """A child for ``action``; ``score`` given makes it a terminal leaf. The
    observation is stored cleaned, as the search stores it."""
    turn, obs = turn_text(action), clean_observation(obs)
    node = Node(
        obs=obs, llm_response=turn, depth=parent.depth + 1,
        recent_actions=parent.recent_actions + [[action, obs]], action=action,
        state=append_turn(parent.state, turn, obs),
    )
    if score is not None or disaster:
        node.is_terminal, node.env_score, node.disaster = True, float(score or 0.0), disaster
    return parent.add_child(node)


def backup(root: Node) -> Node:
    """Back up every terminal leaf once, as the search does."""
    for node in root.iter_nodes():
        if node is not root and node.is_terminal and not node.children:
            walk = node
            while walk is not None:
                walk.visits += 1
                walk.value += node.env_score
                walk = walk.parent
    for node in reversed(list(root.iter_nodes())):
        if node.children:
            node.is_terminal = all(c.is_terminal for c in node.children)
    return root


def write_tree(root: Node, directory: str | Path, idx: int) -> Path:
    path = Path(directory) / f"search_results_{idx}.json"
    atomic_write_json(path, root.to_dict())
    return path


# ------------------------------------------------------------- named trees

def add_good_path(root: Node) -> Node:
    """The successful path A-B-C (log, planks, sticks; score 1) most trees
    share; returns its first step A so a low path can branch off it."""
    a = add_step(root, "get 1 oak log", "Got 1 oak log")
    b = add_step(a, "craft 4 oak planks using 1 oak log", "Crafted 4 minecraft:oak_planks")
    add_step(b, "craft 4 stick using 2 oak planks", "Crafted 4 minecraft:stick", score=1)
    return a


def tree_no_success() -> Node:
    root = make_root()
    add_step(root, "get 1 diamond", "Could not find diamond", score=0)
    add_step(root, "inventory", "Inventory: ", score=0)
    return backup(root)


def tree_one_leaf() -> Node:
    root = make_root()
    add_good_path(root)
    return backup(root)


def tree_scored(scores: list[float]) -> Node:
    """One single-step leaf per score, in this child order."""
    root = make_root()
    for i, s in enumerate(scores):
        add_step(root, f"get {i + 1} oak log", f"Got {i + 1} oak log", score=s)
    return backup(root)


def tree_split_at_root(task: str = TASK) -> Node:
    """Good path A-B-C (score 1); low path X-Y (score 0) shares no step."""
    root = make_root(task)
    add_good_path(root)
    x = add_step(root, "get 1 diamond", "Could not find diamond")
    add_step(x, "inventory", "Inventory: ", score=0)
    return backup(root)


def tree_shared_prefix() -> Node:
    """Good path A-B-C (score 1); low path A-X-Y (score 0) shares step A."""
    root = make_root()
    a = add_good_path(root)
    x = add_step(a, "get 1 diamond", "Could not find diamond")
    add_step(x, "inventory", "Inventory: [oak log] (1)", score=0)
    return backup(root)


def tree_disaster() -> Node:
    """Good path A-B-C (score 1); low path A-D ends in a disaster (score 0)."""
    root = make_root()
    a = add_good_path(root)
    add_step(a, "craft 1 tnt using 1 oak log", "The task failed.", disaster=True)
    return backup(root)


def tree_many_leaves() -> Node:
    """Two good leaves (A-C, G) and four low leaves (A-X1, A-X2, Y, Z-Z1):
    8 pairs over 4 distinct low paths with 7 steps, 6 distinct step prompts
    (step A is shared by A-X1 and A-X2)."""
    root = make_root()
    a = add_step(root, "get 1 oak log", "Got 1 oak log")
    add_step(a, "craft 4 oak planks using 1 oak log", "Crafted 4 minecraft:oak_planks", score=1)
    add_step(a, "get 1 diamond", "Could not find diamond", score=0)
    add_step(a, "get 1 gold", "Could not find gold", score=0)
    add_step(root, "get 4 stick", "Got 4 stick", score=1)
    add_step(root, "inventory", "Inventory: ", score=0)
    z = add_step(root, "get 1 dirt", "Got 1 dirt")
    add_step(z, "get 2 dirt", "Got 2 dirt", score=0)
    return backup(root)


# ------------------------------------------------------------- verifier policy

_STEP = re.compile(r"\(step (\d+)\):\nAction: (.*)")


def judged_step(messages: list[dict]) -> tuple[int, str]:
    """(step number, action) a verifier prompt asks about."""
    m = _STEP.search(messages[-1]["content"])
    assert m, "not a verifier prompt"
    return int(m.group(1)), m.group(2)


def verifier_policy(labels: dict[str, str], default: str = "Good"):
    """A ScriptedBackend policy judging each step by its action: ``labels``
    maps an action to the reply's final label (or to a whole reply when it
    contains a newline)."""

    def policy(messages: list[dict], index: int, seed: int | None) -> str:
        _, action = judged_step(messages)
        label = labels.get(action, default)
        return label if "\n" in label else f"Checking the step against the goal.\nJudgment: {label}"

    return policy


# ------------------------------------------------------------- search policy double

MISTAKE_TURN = "Thought: Let me look at what I have first.\nAction: inventory"


def expert_or_mistake_policy(messages: list[dict], index: int, seed: int | None) -> str:
    """Sample 0 plays the TextCraft expert's next planned step, every other
    sample a useless ``inventory``: searched trees then hold successful leaves
    and failed ones, so they yield revision pairs."""
    from agentenv_servers.textcraft_expert import solve

    turns = [s.turn() for s in solve(messages[3]["content"]).steps]
    done = sum(1 for m in messages[4:] if m["role"] == "assistant" and m["content"] in turns)
    return turns[min(done, len(turns) - 1)] if index == 0 else MISTAKE_TURN


def expert_or_mistake_backend(model_dir=None, **options):
    """Test double for the search policy (not a model):
    ``--backend python:tests.support.tree_fixtures:expert_or_mistake_backend``."""
    from tests.support.doubles import ScriptedBackend

    return ScriptedBackend(expert_or_mistake_policy)
