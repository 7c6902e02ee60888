"""Client for a ScienceWorld server (ours: ``python -m agentenv_servers.sciworld``,
or AgentGym's agentenv-sciworld).

The search also needs the patched endpoints the Agent-R reference used
(/game_nums, /look_around, /inventory, /valid_action_object_combinations). An
upstream AgentGym server lacks them; then this client falls back:

* game_nums: computed locally from ``SCIWORLD_TASKS`` (ScienceWorld 1.2.3's
  task list and variation counts). Exact for scienceworld 1.2.3; approximate if
  the server runs a version with other variation counts.
* look_around: the latest "look around" text this client saw (the reset
  observation, or a later ``look around`` step) - it can be stale.
* inventory: "" (unknown; asking would cost a move).
* valid actions: every template of /action_hint filled with every possible
  object. Approximate: it has combinations the simulator would reject and
  lacks those naming inventory contents.
"""
from __future__ import annotations

import itertools
import logging
import re

from agentenv_client.base import BaseEnvClient, EnvServerError, StepOutput

log = logging.getLogger(__name__)

# (task key, task name, variation count) in ScienceWorld's task-table order
# (scienceworld 1.2.3, tasks.json); AgentGym numbers its games in this order.
SCIWORLD_TASKS: tuple[tuple[str, str, int], ...] = (
    ("1-1", "boil", 30), ("1-2", "melt", 30), ("1-3", "freeze", 30), ("1-4", "change-the-state-of-matter-of", 30),
    ("2-1", "use-thermometer", 540), ("2-2", "measure-melting-point-known-substance", 436),
    ("2-3", "measure-melting-point-unknown-substance", 300), ("3-1", "power-component", 20),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy", 20), ("3-3", "test-conductivity", 900),
    ("3-4", "test-conductivity-of-unknown-substances", 600), ("4-1", "find-living-thing", 300),
    ("4-2", "find-non-living-thing", 300), ("4-3", "find-plant", 300), ("4-4", "find-animal", 300),
    ("5-1", "grow-plant", 126), ("5-2", "grow-fruit", 126), ("6-1", "chemistry-mix", 32),
    ("6-2", "chemistry-mix-paint-secondary-color", 36), ("6-3", "chemistry-mix-paint-tertiary-color", 36),
    ("7-1", "lifespan-longest-lived", 125), ("7-2", "lifespan-shortest-lived", 125),
    ("7-3", "lifespan-longest-lived-then-shortest-lived", 125), ("8-1", "identify-life-stages-1", 14),
    ("8-2", "identify-life-stages-2", 10), ("9-1", "inclined-plane-determine-angle", 168),
    ("9-2", "inclined-plane-friction-named-surfaces", 1386), ("9-3", "inclined-plane-friction-unnamed-surfaces", 162),
    ("10-1", "mendelian-genetics-known-plant", 120), ("10-2", "mendelian-genetics-unknown-plant", 480),
)
# Task types AgentGym leaves out of its game list (long or unsolvable episodes).
EXCLUDED_TASK_KEYS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})


def build_game_list(tasks=SCIWORLD_TASKS) -> list[tuple[str, int]]:
    """Global data index -> (task name, variation), as AgentGym's server orders it."""
    return [(name, v) for key, name, n in tasks if key not in EXCLUDED_TASK_KEYS for v in range(n)]


def build_game_nums(games: list[tuple[str, int]], task_names: list[str]) -> dict[int, list[int]]:
    """Task number (position in ScienceWorld's task-name list, which is
    alphabetical) -> the global indices of its games."""
    pos = {name: i for i, name in enumerate(task_names)}
    out: dict[int, list[int]] = {i: [] for i in range(len(task_names))}
    for idx, (name, _) in enumerate(games):
        out[pos[name]].append(idx)
    return out


_FILLER = frozenset({"a", "an", "the", "on", "in", "into", "to", "at", "of", "with", "and", "from", "for", "please"})

# What a model writes first -> the ScienceWorld verb (template head) it means.
# Matched as the longest phrase at the start of the action.
VERB_PHRASES: dict[str, str] = {
    **{v: v for v in ("look around", "look at", "look in", "read", "pick up", "put down", "move", "go to",
                      "teleport to", "open", "close", "activate", "deactivate", "connect", "disconnect", "use",
                      "pour", "dunk", "mix", "eat", "flush", "focus on", "wait", "wait1", "inventory", "task")},
    "look": "look at", "examine": "look at", "inspect": "look at", "check": "look at", "observe": "look at",
    "view": "look at", "look into": "look in", "look inside": "look in",
    "pick": "pick up", "take": "pick up", "grab": "pick up", "get": "pick up", "drop": "put down",
    "put": "move", "place": "move", "transfer": "move",
    "go": "go to", "walk to": "go to", "walk": "go to", "move to": "go to", "head to": "go to", "enter": "go to",
    "teleport": "teleport to", "shut": "close", "turn on": "activate", "switch on": "activate",
    "turn off": "deactivate", "switch off": "deactivate", "stir": "mix", "dip": "dunk", "focus": "focus on",
    "wait 1": "wait1",
}
# Template heads of valid actions, longest first ("reset task" restarts the
# episode: only an exact match reaches it).
ACTION_HEADS = sorted(set(VERB_PHRASES.values()) | {"reset task"}, key=len, reverse=True)
# Read-only verbs: the only ones chosen when the text names no verb that fits.
HARMLESS = ("look at", "look in", "read")
# Verbs that end or spoil the task when aimed at the wrong object (a wrong
# focus fails a ScienceWorld task): chosen only when the text names the verb
# and exactly the object's words, and the object is in view.
IRREVERSIBLE = frozenset({"focus on", "eat"})


def _head(words: list[str], heads) -> tuple[str | None, list[str]]:
    """(the longest phrase of ``heads`` the words start with, the words after it)."""
    for head in heads:
        n = len(head.split())
        if words[:n] == head.split():
            return head, words[n:]
    return None, words


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _normalise(action: str) -> str:
    return " ".join(action.lower().split()).replace("green house", "greenhouse")


class SciworldEnvClient(BaseEnvClient):
    env_name = "sciworld"
    start_hint = "`python -m agentenv_servers.sciworld --port 36002`"

    def _create(self) -> int:
        payload = self._post("create", {})
        self._last_look = ""
        self._missing: set[str] = set()   # patched endpoints this server lacks
        return self._field(payload, "id", "create")

    def reset(self, idx: int) -> dict:
        payload = self._post("reset", {"data_idx": int(idx)})
        desc = self._field(payload, "task_description", "reset")
        obs = self._field(payload, "observation", "reset")
        self._last_look = obs
        self.info = {"observation": f"{desc}\n{obs}", "reward": 0, "score": 0, "done": False,
                     "task_name": payload.get("task_name"), "var_num": payload.get("var_num")}
        return payload

    def _took_step(self, action: str, payload) -> StepOutput:
        obs = self._field(payload, "observation", "step")
        score = float(self._field(payload, "score", "step"))
        done = bool(self._field(payload, "done", "step"))
        if _normalise(action) == "look around":
            self._last_look = obs
        self.info = {"observation": obs, "reward": payload.get("reward", 0), "score": score, "done": done}
        return StepOutput(state=obs, reward=score, done=done)

    def _replayed(self, payload) -> None:
        """Our server's replay answer names the latest look-around text of the
        replayed episode (the fallback of look_around below reads it)."""
        if isinstance(payload, dict) and isinstance(payload.get("last_look"), str):
            self._last_look = payload["last_look"]

    # ---- extras used by the search --------------------------------------
    def _patched(self, endpoint: str):
        """GET a patched endpoint; None when this server does not have it."""
        if endpoint in self._missing:
            return None
        try:
            return self._get(endpoint)
        except EnvServerError as exc:
            if exc.status == 404:
                log.warning("%s has no /%s (upstream AgentGym server?); using the client-side fallback",
                            self.env_server_base, endpoint)
                self._missing.add(endpoint)
                return None
            raise

    def game_nums(self) -> dict[int, list[int]]:
        got = self._patched("game_nums")
        if got is None:
            games = build_game_list()
            return build_game_nums(games, sorted(name for _, name, _ in SCIWORLD_TASKS))
        return {int(k): [int(i) for i in v] for k, v in got.items()}

    def look_around(self) -> str:
        self._flush()
        got = self._patched("look_around")
        return self._last_look if got is None else str(got)

    def inventory(self) -> str:
        got = self._patched("inventory")
        return "" if got is None else str(got)

    def action_hint(self) -> dict:
        return self._get("action_hint")

    def valid_action_object_combinations(self) -> list[str]:
        got = self._patched("valid_action_object_combinations")
        if got is not None:
            return [str(a) for a in got]
        hint = self.action_hint()
        objects = sorted(set(hint.get("possible_objects", [])))
        out: set[str] = set()
        for template in hint.get("possible_actions", []):
            slots = template.count("OBJ")
            for combo in itertools.product(objects, repeat=slots):
                filled = template
                for obj in combo:
                    filled = filled.replace("OBJ", obj, 1)
                out.add(filled)
        return sorted(out)

    def map_to_valid_action(self, action: str) -> str:
        """Map free text onto a currently valid action (``closest_action``);
        an exact match (after lower-casing, collapsing spaces and writing
        "green house" as "greenhouse") wins."""
        text = _normalise(action)
        valid = sorted(set(self.valid_action_object_combinations()))
        if text in valid:
            return text
        return closest_action(text, valid, self.look_around() + "\n" + self.inventory())


def closest_action(text: str, valid: list[str], visible: str) -> str:
    """The valid action that does what ``text`` says, never one that does more.

    1. An exact match wins.
    2. The verb the text names (its first words, synonyms allowed: "examine"
       is ``look at``, "take" is ``pick up``, "turn on" is ``activate``): the
       valid action with that verb whose object shares the most words with
       the text (then: objects in the text's order, fewer words the text did
       not say, alphabetical order). ``focus on`` and ``eat`` need the text
       to name exactly the object's words, and the object in view
       (``visible``: look-around text plus inventory); a wrong focus fails
       the task.
    3. Otherwise a read-only action (``look at``, ``look in``, ``read``) on
       the object the text names: the reference preferred looking too. No
       other verb is ever chosen for the text, so "read thermometer" becomes
       ``look at thermometer``, never ``focus on thermometer``.
    4. Otherwise the text as is (the environment answers that it does not
       understand), except an irreversible verb whose object did not fit:
       then ``look around``.
    """
    text = _normalise(text)
    if text in valid:
        return text
    verb, rest = _head(_words(text), sorted(VERB_PHRASES, key=len, reverse=True))
    verb = VERB_PHRASES.get(verb) if verb else None
    want = [w for w in rest if w not in _FILLER]
    if verb == "look at" and not want:
        verb = "look around"
    by_verb: dict[str, list[tuple[str, list[str]]]] = {}
    for cand in valid:
        head, obj = _head(_words(cand), ACTION_HEADS)
        by_verb.setdefault(head or "", []).append((cand, [w for w in obj if w not in _FILLER]))
    if verb is not None:
        if verb in valid and not any(obj for _, obj in by_verb.get(verb, [])):   # "inventory", "wait", ...
            return verb
        found = _best_object(want, by_verb.get(verb, []), exact=verb in IRREVERSIBLE, seen=set(_words(visible)))
        if found:
            return found
    found = _best_object(want, [c for head in HARMLESS for c in by_verb.get(head, [])])
    if found:
        return found
    return "look around" if verb in IRREVERSIBLE and "look around" in valid else text


def _best_object(want: list[str], candidates: list[tuple[str, list[str]]], exact: bool = False,
                 seen: set[str] | None = None) -> str | None:
    """The candidate whose object words share the most with ``want``; ties:
    the shared words in the text's order ("move a to b" is not "move b to
    a"), fewer words the text did not say, alphabetical. ``exact``: the
    object's words are the text's, and all of them are in ``seen``."""
    best, best_key = None, None
    wanted = set(want)
    for cand, obj in candidates:
        shared = wanted & set(obj)
        if not shared or (exact and not (set(obj) == wanted and wanted <= (seen or set()))):
            continue
        same_order = [w for w in obj if w in shared] == [w for w in want if w in shared]
        key = (-len(shared), not same_order, len(set(obj) - wanted), cand)
        if best_key is None or key < best_key:
            best, best_key = cand, key
    return best
