"""The MCTS node and the JSON schema of a tree file (the reference's "search_results_{idx}.json").

The key set and key order of a serialised node are a compatibility contract:
tools written for the reference scripts load these files. Run metadata goes in
a separate manifest, never into the nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

EXPLORATION_C = 0.25

NODE_KEYS = (
    "visits", "value", "prior", "puct_value", "obs", "llm_response", "depth",
    "is_terminal", "recent_actions", "action", "env_score", "disaster", "state",
    "children",
)


class TreeFormatError(ValueError):
    """A tree file that does not follow the node schema."""

    user_facing = True


@dataclass(eq=False)
class Node:
    visits: int = 0
    value: float = 0.0
    obs: str = ""
    llm_response: str = "ROOT"
    depth: int = 0
    is_terminal: bool = False
    recent_actions: list = field(default_factory=list)
    action: str = "ROOT"
    env_score: float = 0.0
    disaster: bool = False
    state: list = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)
    parent: Optional["Node"] = field(default=None, repr=False)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def add_child(self, child: "Node") -> "Node":
        child.parent = self
        self.children.append(child)
        return child

    def mean_value(self) -> float:
        return self.value / self.visits if self.visits else 0.0

    def selection_score(self, c: float = EXPLORATION_C) -> float:
        """UCT score used to pick among siblings; +inf while unvisited (so every
        child is tried once before any is tried twice)."""
        if self.parent is None:
            return self.mean_value()
        if self.visits == 0:
            return math.inf
        parent_visits = max(self.parent.visits, 1)
        return self.value / self.visits + c * math.sqrt(math.log(parent_visits) / self.visits)

    def stored_puct(self) -> float:
        """The ``puct_value`` written to tree JSON, as the reference wrote it: 0
        for an unvisited node (the +inf of selection is not JSON; strict
        parsers in JavaScript, Go, Rust or Java reject ``Infinity``)."""
        return 0.0 if self.visits == 0 and self.parent is not None else self.selection_score()

    def iter_nodes(self) -> Iterator["Node"]:
        yield self
        for child in self.children:
            yield from child.iter_nodes()

    def path_from_root(self) -> list["Node"]:
        """Nodes from the root (excluded) down to self (included)."""
        path, node = [], self
        while node.parent is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "visits": self.visits,
            "value": float(self.value),
            "prior": 1,
            "puct_value": self.stored_puct(),
            "obs": self.obs,
            "llm_response": self.llm_response,
            "depth": self.depth,
            "is_terminal": self.is_terminal,
            "recent_actions": [list(a) if isinstance(a, (list, tuple)) else a for a in self.recent_actions],
            "action": self.action,
            "env_score": self.env_score,
            "disaster": self.disaster,
            "state": self.state,
            "children": [c.to_dict() for c in self.children],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "root") -> "Node":
        if not isinstance(data, dict):
            raise TreeFormatError(f"{where}: expected a node object, got {type(data).__name__}")
        missing = [k for k in NODE_KEYS if k not in data]
        if missing:
            raise TreeFormatError(f"{where}: node is missing keys {missing}")
        if not isinstance(data["children"], list):
            raise TreeFormatError(f"{where}: 'children' must be a list")
        try:
            node = cls(
                visits=int(data["visits"]),
                value=float(data["value"]),
                obs=str(data["obs"]),
                llm_response=str(data["llm_response"]),
                depth=int(data["depth"]),
                is_terminal=bool(data["is_terminal"]),
                recent_actions=list(data["recent_actions"]),
                action=str(data["action"]),
                env_score=float(data["env_score"]),
                disaster=bool(data["disaster"]),
                state=list(data["state"]),
            )
        except (TypeError, ValueError) as exc:
            raise TreeFormatError(f"{where}: bad field value ({exc})") from None
        for i, child in enumerate(data["children"]):
            node.add_child(cls.from_dict(child, where=f"{where}.children[{i}]"))
        return node


def leaf_paths(root: Node) -> list[list[Node]]:
    """Root-to-leaf paths (root excluded) ending at terminal childless nodes, in
    stored child order."""
    return [leaf.path_from_root() for leaf in root.iter_nodes()
            if leaf is not root and leaf.is_terminal and not leaf.children]


def load_tree(path) -> Node:
    """Read a tree file; corrupt JSON or a schema violation raises TreeFormatError
    naming the file."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise TreeFormatError(f"{path}: corrupt JSON ({exc})") from None
    try:
        return Node.from_dict(data)
    except TreeFormatError as exc:
        raise TreeFormatError(f"{path}: {exc}") from None
