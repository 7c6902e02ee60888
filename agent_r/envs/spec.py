"""What every environment has, and the rules shared by all of them: the
``EnvSpec`` base (server, client, score scale, splits, search depth, revision
thresholds, action mapping, history format), named task lists (``Split``),
how the server in use is identified, and how task-list files are read. The
per-environment files (textcraft.py, sciworld.py, webshop.py) import only this
module; ``agent_r/envs/__init__.py`` imports them for the registry.

Splits. A task index only means a task on a given server: AgentGym's TextCraft
server orders goals of equal recipe depth by directory listing order, ours by
item id. So every named split (``Split``) records the server kinds its ids
were made for, and the server in use is identified first (``identify_server``:
ours answer GET /identity, AgentGym's cannot). The default split is the
paper's AgentEval lists wherever they were made for that server, and a search
never touches a test task of the split in use (``EnvSpec.search_indices``).
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from agent_r.settings import UsageError
from agent_r.splits import SPLIT_DIR, load_split_file

log = logging.getLogger("agent_r.envs")   # one logger for every environment

AGENT_R = "agent-r"      # our servers (agentenv_servers): they say what they are at GET /identity
AGENTGYM = "agentgym"    # AgentGym's servers, and any other server that does not say


@dataclass(frozen=True)
class ServerIdentity:
    """What the server in use is, as far as it can tell us."""

    kind: str                   # AGENT_R or AGENTGYM
    env: str | None = None      # the environment an agent-r server serves
    tasks: int | None = None    # the number of task indices it serves (None: unknown)
    url: str = ""

    def describe(self) -> str:
        where = f" at {self.url}" if self.url else ""
        if self.kind == AGENT_R:
            return f"the agent-r {self.env or ''} server{where}".replace("  ", " ")
        return f"the server{where} (no GET /identity: AgentGym's, or another one that does not identify itself)"


LOCAL = ServerIdentity(AGENT_R)  # our servers, and agentenv_servers' in-process games (the same task order)


@dataclass(frozen=True)
class Split:
    """A named (train, test) pair of task lists under agent_r/splits."""

    name: str
    test: str                   # file name under agent_r/splits
    train: str | None           # None: the environment picks search tasks its own way (SciWorld: task numbers)
    servers: tuple[str, ...]    # server kinds whose index -> task mapping these ids were made for
    tasks: int                  # how many task indices that server has (a server with another count means others)
    about: str                  # one line for docs and warnings

    def indices(self, which: str, env: str) -> list[int]:
        """The ids of its train or test list."""
        file = self.train if which == "train" else self.test
        if file is None:
            raise UsageError(f"{env} split {self.name!r} has no {which} list; pass --split_file with an AgentGym "
                             f"task list (a JSON list of {{\"item_id\": \"{env}_<idx>\"}})")
        return load_split_file(str(SPLIT_DIR / file))


@dataclass(frozen=True)
class StepScore:
    score: float      # what the node / episode records (0 for a disaster)
    disaster: bool    # negative reward: the episode failed irrecoverably


@dataclass(frozen=True)
class EnvSpec:
    name: str
    default_server: str
    data_len: int
    client_class: Callable[..., Any]
    splits: tuple[Split, ...]    # named splits; the first one made for a server kind is that kind's default
    max_score: float             # score of a fully solved task (1 or 100)
    max_depth: int               # default MAX_DEPTH: about the steps a solved episode needs
    alpha: float                 # default ALPHA: a good path's leaf must score above it
    beta: float                  # default BETA: a pair's score gap must exceed it
    goal_pattern: str | None = None   # regex whose group 1 is the goal item in a task's observation
    refusal_pattern: str | None = None   # regex matching an observation in which the environment refused the action

    def refused(self, observation: str) -> bool:
        """Whether the environment answered a turn by refusing its action (an
        unknown command, a missing ingredient): the step changed nothing."""
        return self.refusal_pattern is not None and re.match(self.refusal_pattern, observation.strip()) is not None

    def goal(self, observations: list[str]) -> str | None:
        """The item a task asks for, read from its first observation that
        names one (None: this environment names none)."""
        if self.goal_pattern is None:
            return None
        for text in observations:
            found = re.search(self.goal_pattern, text)
            if found:
                return found.group(1).strip().lower()
        return None

    def action_kind(self, action: str, goal: str | None) -> str:
        """What an action does, for counting what a model does after its
        revision turn: its verb (``get``, ``craft``, ``inventory``...),
        ``goal_craft`` for a craft of the task's goal item, ``none`` where
        the turn has no action."""
        words = action.strip().lower().split()
        if not words:
            return "none"
        if goal and words[0] == "craft" and re.match(rf"craft\s+\d+\s+{re.escape(goal)}(\s+using\b|$)",
                                                      " ".join(words)):
            return "goal_craft"
        return words[0]

    def make_client(self, env_server_base: str | None = None, instruction_file: str | None = None, **kwargs):
        return self.client_class(env_server_base=env_server_base or self.default_server, data_len=self.data_len,
                                 instruction_file=instruction_file, **kwargs)

    def prepare_action(self, client, action: str) -> str:
        """The action actually stepped (clients clean their own text)."""
        return action

    def history_entry(self, action: str, observation: str) -> Any:
        """One item of a node's ``recent_actions``."""
        return [action, observation]

    def step_score(self, reward: float) -> StepScore:
        """A NaN/Infinity reward is a server fault, refused here so that no tree,
        result or summary ever holds one (strict JSON cannot)."""
        if not math.isfinite(reward):
            raise ValueError(f"the {self.name} server returned a non-finite reward ({reward})")
        if reward < 0:
            return StepScore(0.0, True)
        return StepScore(float(reward), False)

    def is_success(self, score: float) -> bool:
        return score >= self.max_score

    # ---- splits --------------------------------------------------------------

    def default_split(self, server: ServerIdentity = LOCAL) -> Split:
        """The first split made for this kind of server: the paper's AgentEval
        lists wherever their ids mean the paper's tasks."""
        return next((s for s in self.splits if server.kind in s.servers), self.splits[0])

    def named_split(self, name: str) -> Split:
        """The split called ``name`` (``--split``), checked before any server is asked."""
        by_name = {s.name: s for s in self.splits}
        if name not in by_name:
            raise UsageError(f"--split={name!r} is not a {self.name} split; choose one of: {', '.join(by_name)}")
        return by_name[name]

    def split(self, name: str | None = None, server: ServerIdentity | None = None) -> Split:
        """The split in use: ``name`` (``--split``) or the server's default
        (``server`` None: not known, our servers' default, unchecked). Refused
        when the server serves another number of tasks (the ids would name
        other tasks); a warning when it was made for another kind of server
        (same indices, other tasks behind some of them)."""
        chosen = self.named_split(name) if name is not None else self.default_split(server or LOCAL)
        if server is None:
            return chosen
        if server.tasks is not None and server.tasks != chosen.tasks:
            raise UsageError(
                f"split {chosen.name!r} of {self.name} indexes {chosen.tasks} tasks but {server.describe()} serves "
                f"{server.tasks}: its ids would name other tasks; run the server with the standard game data"
            )
        if server.kind not in chosen.servers:
            log.warning("split %r (%s) was made for %s servers, not for %s: some of its ids name other tasks "
                        "there; see docs/environments.md 'Splits'", chosen.name, chosen.about,
                        " / ".join(chosen.servers), server.describe())
        return chosen

    def split_indices(self, which: str, split_file: str | None = None, split: str | None = None,
                      server: ServerIdentity | str | None = None) -> list[int]:
        """Task indices of the train or test list: ``split_file`` when given,
        else the named split's, by default the one for ``server`` (an identity,
        or a URL identified only when needed; None: our servers' default, as
        for agentenv_servers' in-process games)."""
        if split_file is not None:
            return load_split_file(split_file)
        if split is not None:
            self.named_split(split)
        if isinstance(server, str):
            server = identify_server(server, self)
        return self.split(split, server).indices(which, self.name)

    def search_indices(self, settings: Any, server: str) -> tuple[list[int], str]:
        """(train task indices a search covers, a phrase saying how they were
        chosen). Never a test task of the split in use: the contamination
        guard, applied to every way of choosing (slices, --split_file, SciWorld
        task numbers) on every server."""
        name = getattr(settings, "split", None)
        if name is not None:
            self.named_split(name)                # a bad --split or split file fails before the server check
        if settings.split_file is not None:
            load_split_file(settings.split_file)
        identity = identify_server(server, self)
        chosen_split = self.split(name, identity)
        chosen, where = self.search_candidates(settings, server, chosen_split)
        test = set(chosen_split.indices("test", self.name))
        dropped = [i for i in chosen if i in test]
        if dropped:
            log.warning("skipping %d test task(s) of the %r split (never searched): %s", len(dropped),
                        chosen_split.name, dropped[:10])
        kept = [i for i in chosen if i not in test]
        log.info("search tasks: %d selected (%s of the %r split)", len(kept), where, chosen_split.name)
        return kept, where

    def search_candidates(self, settings: Any, server: str, split: Split) -> tuple[list[int], str]:
        """Search tasks before the guard: --split_file or the split's train
        list, sliced by --min/--max."""
        if settings.split_file is not None:
            train = load_split_file(settings.split_file)
        else:
            train = split.indices("train", self.name)
        hi = settings.max if settings.max is not None else float("inf")
        chosen = [i for i in train if settings.min <= i < hi]
        end = settings.max if settings.max is not None else "end"
        return chosen, f"indices in [{settings.min}, {end}) of the {len(train)} train tasks"


def identify_server(url: str, spec: EnvSpec | None = None) -> ServerIdentity:
    """Ask the server what it is (GET /identity). Ours answer; AgentGym's
    answer 404 (or anything that is not our JSON): those are AGENTGYM. A
    server that serves another environment than ``spec`` is refused; one that
    cannot be reached is a one-line usage error."""
    import requests

    try:
        reply = requests.get(url.rstrip("/") + "/identity", timeout=10)
    except requests.RequestException as exc:
        raise UsageError(
            f"cannot reach the env server at {url} ({type(exc).__name__}); start it (see docs/search.md) "
            "or pass --env_server_base with its URL"
        ) from None
    try:
        data = reply.json() if reply.status_code == 200 else None
    except ValueError:
        data = None
    if not (isinstance(data, dict) and data.get("server") == AGENT_R):
        return ServerIdentity(AGENTGYM, url=url)
    tasks = data.get("tasks")
    identity = ServerIdentity(AGENT_R, env=str(data.get("env")), url=url,
                              tasks=tasks if isinstance(tasks, int) and not isinstance(tasks, bool) else None)
    if spec is not None and identity.env != spec.name:
        raise UsageError(f"the env server at {url} serves {identity.env}, not TASK={spec.name}: pass "
                         f"--env_server_base with the {spec.name} server's URL")
    return identity
