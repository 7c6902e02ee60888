"""Revision samples from a search tree: pairing leaf paths, and splicing.

A tree gives leaf paths with scores. A *pair* is a high-scoring path and a
low-scoring one: every ordered pair whose high path scores above ALPHA and
whose gap exceeds BETA, shuffled with a seeded generator. The verifier
(agent_r/verifier.py) judges the steps of each low path; the *bad prefix*
ends at the first step judged Bad (with revise off, the whole low path). The
training sample splices: bad prefix (no loss) + a revision turn (loss) + the
good path from where it leaves the bad prefix (loss). A tree's low paths are
judged once each, all trees of a batch in one model call.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Sequence

from agent_r.conversation import HEAD_LEN, Message, parse_action
from agent_r.llm import Backend
from agent_r.tree import Node, TreeFormatError, leaf_paths
from agent_r.verifier import Verdict, verify_paths

# The revision turn a training sample splices in: a revision thought, the
# action ``wait``, and this reply as the next observation. Eval's
# ``WAIT_REPLY=ok`` answers the model's revision ``wait`` with the same text.
REVISION_ACTION = "wait"
REVISION_REPLY = "ok."
# Tasks where ``wait`` is also a game action: there only a ``wait`` under a
# revision thought is the revision turn.
WAIT_IS_A_GAME_ACTION = frozenset({"sciworld"})

# Our own self-correction sentences for the revision turn; every one is reachable.
REVISION_THOUGHTS = (
    "I made a mistake somewhere in the previous steps, so I should stop and rethink my plan.",
    "Looking back, my recent actions did not move me toward the goal; I need a different approach.",
    "Something went wrong in what I just did. Let me pause and reconsider before acting again.",
    "My last steps were not helpful for this task. I should correct course now.",
    "I think I took a wrong turn earlier. I will step back and try a better plan.",
    "This is not working as intended; I need to revise my strategy before continuing.",
    "I realise my previous actions were misguided. Let me reconsider what the task really needs.",
    "I have been heading in the wrong direction. Time to fix my approach.",
    "On reflection, the path I followed is a dead end. I should take a different route.",
    "My earlier choice was an error. Let me reassess the situation and continue more carefully.",
    "I notice my recent steps are not making progress. I will change my plan.",
    "That did not go well. I should acknowledge the mistake and try something more sensible.",
)

_THOUGHTS = tuple(" ".join(t.lower().split()) for t in REVISION_THOUGHTS)


def has_revision_thought(turn: str) -> bool:
    text = " ".join(turn.lower().split())
    return any(t in text for t in _THOUGHTS)


def is_revision_wait(turn: str, task: str = "textcraft") -> bool:
    """A turn whose action is the revision turn's ``wait``: any ``wait``
    where it is no game action, else (SciWorld) only one under a revision
    thought, so the game's own ``wait`` still reaches the game."""
    if parse_action(turn).strip().lower() != REVISION_ACTION:
        return False
    return task not in WAIT_IS_A_GAME_ACTION or has_revision_thought(turn)


def is_revision_turn(turn: str, task: str = "textcraft") -> bool:
    """A model turn that revises: one of the revision thoughts, or the
    ``wait`` action the revision turn of a training sample takes (in tasks
    where ``wait`` is no game action)."""
    return has_revision_thought(turn) or is_revision_wait(turn, task)


def model_turns(result: dict) -> list[str]:
    """The turns the evaluated model chose in an eval result (replayed
    prefix turns left out)."""
    turns = [m["content"] for m in result.get("state", [])[HEAD_LEN:] if m.get("role") == "assistant"]
    return turns[int(result.get("replayed_steps") or 0):]


def model_exchanges(result: dict) -> list[tuple[str, str | None]]:
    """Each turn the evaluated model chose with the observation that answered
    it (None after the last turn), replayed prefix turns left out."""
    messages = result.get("state", [])[HEAD_LEN:]
    pairs = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        reply = messages[i + 1] if i + 1 < len(messages) and messages[i + 1].get("role") == "user" else None
        pairs.append((m["content"], reply["content"] if reply else None))
    return pairs[int(result.get("replayed_steps") or 0):]


def revision_turns(result: dict, task: str = "textcraft") -> int:
    """How many of an eval result's model turns are revision turns."""
    return sum(1 for t in model_turns(result) if is_revision_turn(t, task))


@dataclass(frozen=True)
class RevisionConfig:
    """The settings that decide a tree's rows, and nothing else: the part
    cache fingerprints exactly these, so a setting that cannot change a row
    (paths, batch size, backend tuning) never invalidates finished work.

    No defaults here on purpose: the one place that knows them is
    ``agent_r.revision_data.PathSettings``, whose ``revision_config()`` builds
    this. ``alpha``/``beta`` are on the task's score scale (TextCraft/WebShop
    0-1, SciWorld 0-100)."""

    alpha: float
    beta: float
    data_type: str                      # "centric" (revision pairs) or "good"
    revise: bool                        # ask the verifier; off = whole low path is the bad prefix
    seed: int
    max_pairs_per_tree: int             # 0 = no cap
    verifier_temperature: float
    max_new_tokens: int
    max_token_length: int               # verifier prompt budget (minus 60), oldest history dropped

    @property
    def needs_verifier(self) -> bool:
        return self.data_type == "centric" and self.revise


@dataclass
class TreeRows:
    """What one tree contributed: output rows and the counts the summary shows.
    Stored as a dict in the tree's part file, so a rerun rebuilds it unchanged."""

    rows: list[dict] = field(default_factory=list)
    skipped: bool = False              # root value <= 0: no successful leaf
    pairs: int = 0
    revision_samples: int = 0
    good_samples: int = 0
    empty_suffix_pairs: int = 0        # good path adds nothing after the bad prefix: dropped
    verifier_prompts: int = 0
    unparseable: int = 0               # verifier replies without a readable label (treated as Uncertain)
    first_bad: dict[str, int] = field(default_factory=dict)  # "1", "2", ... or "none" -> count

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TreeRows":
        """The inverse of ``to_dict``; TypeError for a dict of another shape."""
        return cls(**data)


# ---------------------------------------------------------------- paths

def path_score(path: list[Node]) -> float:
    """A leaf path's score: its leaf's value/visits (= the leaf's env score)."""
    return path[-1].mean_value()


def path_key(path: list[Node]) -> tuple[int, ...]:
    """Identity of a path inside its tree: the child index taken at each depth."""
    return tuple(node.parent.children.index(node) for node in path)


def node_turn(node: Node) -> tuple[str, str]:
    """(assistant turn, observation) of a node as it appears in the conversation."""
    if len(node.state) < HEAD_LEN + 2:
        raise TreeFormatError(f"node at depth {node.depth}: 'state' has {len(node.state)} messages, "
                              f"expected >= {HEAD_LEN + 2}")
    turn, obs = node.state[-2], node.state[-1]
    if not (isinstance(turn, dict) and turn.get("role") == "assistant" and isinstance(obs, dict)):
        raise TreeFormatError(f"node at depth {node.depth}: 'state' does not end with an assistant turn "
                              "and its observation")
    return str(turn.get("content", "")), str(obs.get("content", ""))


def head_messages(root: Node) -> list[Message]:
    """Messages 0-3 of the root; the fixed "Ok." turn is never trained."""
    if len(root.state) < HEAD_LEN:
        raise TreeFormatError(f"root 'state' has {len(root.state)} messages, expected >= {HEAD_LEN}")
    roles = [m.get("role") if isinstance(m, dict) and "content" in m else None for m in root.state[:HEAD_LEN]]
    if roles != ["system", "user", "assistant", "user"]:
        raise TreeFormatError(f"root 'state' must start with system, user, assistant, user messages "
                              f"(role + content each), got roles {roles}")
    head = [{"role": str(m["role"]), "content": str(m["content"])} for m in root.state[:HEAD_LEN]]
    head[2]["loss"] = False
    return head


def turns_messages(turns: Sequence[tuple[str, str]], loss: bool) -> list[Message]:
    out: list[Message] = []
    for turn, obs in turns:
        out.append({"role": "assistant", "content": turn, "loss": loss})
        out.append({"role": "user", "content": obs})
    return out


def good_only_messages(root: Node, path: list[Node]) -> list[Message]:
    return head_messages(root) + turns_messages([node_turn(n) for n in path], loss=True)


def sorted_leaf_paths(root: Node) -> list[list[Node]]:
    """Leaf paths, best score first; equal scores keep stored child order."""
    return sorted(leaf_paths(root), key=lambda p: -path_score(p))


def select_pairs(paths: list[list[Node]], cfg: RevisionConfig, rng: random.Random) -> list[tuple[list[Node], list[Node]]]:
    """All ordered (high, low) pairs clearing ALPHA and BETA, shuffled; cut to
    --max_pairs_per_tree only when set (the reference kept them all)."""
    pairs = [(high, low) for high in paths for low in paths
             if high is not low and path_score(high) > cfg.alpha and path_score(high) - path_score(low) > cfg.beta]
    rng.shuffle(pairs)
    if cfg.max_pairs_per_tree > 0:
        pairs = pairs[:cfg.max_pairs_per_tree]
    return pairs


def good_paths(root: Node, paths: list[list[Node]], cfg: RevisionConfig) -> list[list[Node]]:
    """Leaf paths scoring above ALPHA, deduplicated by their turns (first kept)."""
    out, seen = [], set()
    for path in paths:
        if path_score(path) <= cfg.alpha:
            continue
        key = tuple(node_turn(n) for n in path)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


# ---------------------------------------------------------------- splice

def divergence_index(good: Sequence[tuple[str, str]], bad_prefix: Sequence[tuple[str, str]]) -> int:
    """Where the good path continues after the bad prefix: the first position
    whose assistant turn differs. If the bad prefix is a proper prefix of the
    good path (the verifier flagged a step the good path shares), this is
    len(bad_prefix): the good path continues right after the shared part."""
    for i, (g, b) in enumerate(zip(good, bad_prefix)):
        if g[0] != b[0]:
            return i
    return min(len(good), len(bad_prefix))


def splice(head: list[Message], bad_prefix: Sequence[tuple[str, str]], good: Sequence[tuple[str, str]],
           thought: str) -> list[Message] | None:
    """bad prefix (no loss) + revision turn (loss) + good suffix (loss); None
    when the good path has nothing after the bad prefix."""
    suffix = good[divergence_index(good, bad_prefix):]
    if not suffix:
        return None
    return (
        [dict(m) for m in head]
        + turns_messages(bad_prefix, loss=False)
        + [{"role": "assistant", "content": f"Thought: {thought}\nAction: {REVISION_ACTION}", "loss": True},
           {"role": "user", "content": REVISION_REPLY}]
        + turns_messages(suffix, loss=True)
    )


# ---------------------------------------------------------------- per tree

@dataclass
class TreePlan:
    """A parsed tree and what it will emit, before any model call."""

    idx: int
    root: Node
    pairs: list[tuple[list[Node], list[Node]]]
    goods: list[list[Node]]
    rng: random.Random
    low_paths: dict[tuple[int, ...], list[Node]]  # distinct low paths, first-seen order


def plan_tree(idx: int, root: Node, cfg: RevisionConfig) -> TreePlan | None:
    """None when the tree has no successful leaf (root value <= 0)."""
    if root.value <= 0:
        return None
    head_messages(root)  # validate the states now, so a bad tree fails alone
    paths = sorted_leaf_paths(root)
    for path in paths:
        for node in path:
            node_turn(node)
    rng = random.Random(f"{cfg.seed}:{idx}")
    if cfg.data_type == "good":
        return TreePlan(idx, root, [], good_paths(root, paths, cfg), rng, {})
    pairs = select_pairs(paths, cfg, rng)
    lows: dict[tuple[int, ...], list[Node]] = {}
    for _, low in pairs:
        lows.setdefault(path_key(low), low)
    return TreePlan(idx, root, pairs, [], rng, lows)


def build_rows(plan: TreePlan, cfg: RevisionConfig, verdicts: dict[tuple[int, ...], Verdict]) -> TreeRows:
    """Rows of one tree, given the verdicts of its distinct low paths (empty
    when the verifier is off)."""
    res = TreeRows()
    if cfg.data_type == "good":
        res.rows = [{"task_num": str(plan.idx), "revise_log": good_only_messages(plan.root, path), "revise": False}
                    for path in plan.goods]
        res.good_samples = len(res.rows)
        return res
    res.pairs = len(plan.pairs)
    for verdict in verdicts.values():
        pos = "none" if verdict.first_bad is None else str(verdict.first_bad)
        res.first_bad[pos] = res.first_bad.get(pos, 0) + 1
    for high, low in plan.pairs:
        # drawn for every pair, also a dropped one, so a row's thought does not
        # depend on whether an earlier pair of its tree was dropped
        thought = plan.rng.choice(REVISION_THOUGHTS)
        row = revision_row(plan, cfg, high, low, verdicts.get(path_key(low)), thought)
        if row is None:
            res.empty_suffix_pairs += 1
        else:
            res.rows.append(row)
    res.revision_samples = len(res.rows)
    return res


def revision_row(plan: TreePlan, cfg: RevisionConfig, high: list[Node], low: list[Node],
                 verdict: Verdict | None, thought: str) -> dict | None:
    """One pair's output row: task_num, revise_log (the splice), high_log and
    low_log (each path with every turn trained), task_description (the first
    observation), revise, revise_feedback (one judgement per step of the bad
    prefix; "" for direct revision). None when the good path adds nothing
    after the bad prefix. ``verdict`` None = direct revision."""
    head = head_messages(plan.root)
    high_turns = [node_turn(n) for n in high]
    low_turns = [node_turn(n) for n in low]
    if cfg.needs_verifier:
        cut = verdict.cut
        feedback: list[dict] | str = [
            {"revision_feedback": reply, "action": node.action, "obs": node.obs, "judgement": label}
            for node, label, reply in zip(low[:cut], verdict.labels, verdict.replies)
        ]
    else:
        cut, feedback = len(low_turns), ""
    spliced = splice(head, low_turns[:cut], high_turns, thought)
    if spliced is None:
        return None
    return {
        "task_num": str(plan.idx),
        "revise_log": spliced,
        "high_log": head_messages(plan.root) + turns_messages(high_turns, loss=True),
        "low_log": head_messages(plan.root) + turns_messages(low_turns, loss=True),
        "task_description": head[3]["content"],
        "revise": cfg.revise,
        "revise_feedback": feedback,
    }


def process_trees(plans: list[TreePlan], cfg: RevisionConfig, backend: Backend | None) -> list[TreeRows]:
    """Rows for a batch of planned trees; with the verifier on, all distinct
    low paths of all these trees are judged in one backend call."""
    jobs, owners = [], []
    if cfg.needs_verifier:
        for t, plan in enumerate(plans):
            task = head_messages(plan.root)[3]["content"]
            for key, low in plan.low_paths.items():
                jobs.append((task, low, cfg.seed * 1_000_003 + plan.idx))
                owners.append((t, key))
    if jobs and backend is None:
        raise ValueError("the verifier needs a backend (data_type centric with revise on)")
    verdicts, counts = verify_paths(backend, cfg, jobs) if jobs else ([], [])
    per_tree: list[dict] = [{} for _ in plans]
    sent, unparseable = [0] * len(plans), [0] * len(plans)
    for (t, key), verdict, (n, bad) in zip(owners, verdicts, counts):
        per_tree[t][key] = verdict
        sent[t] += n
        unparseable[t] += bad
    results = [build_rows(plan, cfg, per_tree[t]) for t, plan in enumerate(plans)]
    for res, n, bad in zip(results, sent, unparseable):
        res.verifier_prompts, res.unparseable = n, bad
    return results


def histogram(counts: Counter) -> str:
    keys = sorted((k for k in counts if k != "none"), key=int) + (["none"] if "none" in counts else [])
    return " ".join(f"{k}:{counts[k]}" for k in keys) or "-"
