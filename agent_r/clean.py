"""Clean continuations (CLEAN_PATHS=1, ``path_collection.py export
--clean_paths 1``): what a sample teaches after its revision turn, cut to the
steps the goal needs, by replaying it on the environment server.

Why: a searched good path keeps every step the search happened to take,
refused ones (TextCraft's "Could not find ...") and repeats of accepted
actions among them, and a revision sample continues with that path from
where it leaves the bad prefix. A model trained on it learns recoveries that
wander. Masking refused turns (MASK_REFUSED) takes them out of the loss but
leaves them in the context the model learns to continue, and leaves the
repeats trained.

What a cleaned row is: its bad prefix and revision turn as they were
(revision rows), then the continuation's actions replayed from the task's
start (after the bad prefix, whose actions are replayed too) with
* every step the environment refused cut, then
* front to back, every step whose removal still reaches the goal cut (each
  cut checked by a replay: a repeat stays only where the goal fails without
  it), and the steps after the goal dropped;
and each observation the one the environment returns on that replay. A row
whose replay does not reach the goal is left out and counted. The paper's
rows splice the good path's recorded observations after the bad prefix;
how many of them the environment reproduces from the bad prefix's end state
is counted too.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from tqdm import tqdm

from agent_r.conversation import HEAD_LEN, clean_observation, parse_action
from agent_r.envs import get_env
from agent_r.envs.spec import EnvSpec

log = logging.getLogger(__name__)

Turn = tuple[str, str]   # (assistant turn, observation)


@dataclass
class CleanReport:
    """What cleaning did to one export's rows."""

    rows: int = 0                      # rows read
    kept: int = 0                      # rows written, cleaned
    left_out: int = 0                  # the replay did not reach the goal
    steps_before: int = 0              # continuation steps before cleaning
    refused_cut: int = 0               # steps the environment refused
    unneeded_cut: int = 0              # steps the goal was reached without
    after_goal_cut: int = 0            # steps after the goal was already reached
    spliced: int = 0                   # revision rows (bad prefix + revision turn + continuation)
    spliced_as_recorded: int = 0       # of those, the environment returns the recorded observations

    def line(self) -> str:
        cut = self.refused_cut + self.unneeded_cut + self.after_goal_cut
        return (f"clean paths: {self.kept} of {self.rows} rows kept ({self.left_out} left out: their replay does not "
                f"reach the goal); {cut} of {self.steps_before} continuation steps cut ({self.refused_cut} refused, "
                f"{self.unneeded_cut} unneeded, {self.after_goal_cut} after the goal); {self.spliced_as_recorded} "
                f"of {self.spliced} spliced revision rows replay as recorded from the bad prefix's end state")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Replay:
    observations: list[str]            # one per step taken
    success: bool
    steps: int                         # steps taken: the goal or a disaster ends the replay early


class Replayer:
    """One env client replaying action lists of one environment from a task's start."""

    def __init__(self, spec: EnvSpec, server: str):
        self.spec = spec
        self.client = spec.make_client(server)

    def __call__(self, task: int, actions: list[str]) -> Replay:
        self.client.reset(task)
        observations, score = [], 0.0
        for action in actions:
            out = self.client.step(self.spec.prepare_action(self.client, action))
            scored = self.spec.step_score(out.reward)
            observations.append(clean_observation(out.state))
            score = scored.score
            if scored.disaster or out.done:
                break
        return Replay(observations, self.spec.is_success(score), len(observations))

    def close(self) -> None:
        from agent_r.driver import close_quietly

        close_quietly(self.client)


def pairs_of(messages: list[dict]) -> list[tuple[dict, dict]]:
    """(assistant message, observation message) after the head."""
    body = messages[HEAD_LEN:]
    return [(body[i], body[i + 1]) for i in range(0, len(body) - 1, 2)]


@dataclass
class Cleaned:
    kept: list[int]                    # indices of the continuation's steps kept
    observations: list[str]            # theirs, on the final replay
    refused: int
    unneeded: int
    after_goal: int


def clean_continuation(replay: Callable[[list[str]], Replay], prefix: list[str], steps: list[str],
                       refused: Callable[[str], bool]) -> Optional[Cleaned]:
    """``steps`` after ``prefix`` cut to what the goal needs, or None where
    prefix + steps do not reach the goal (or the prefix alone ends the episode)."""
    first = replay(prefix + steps)
    if not first.success or first.steps <= len(prefix):
        return None
    done = first.steps - len(prefix)               # steps past the goal are never stepped
    seen = first.observations[len(prefix):]
    kept = [i for i in range(done) if not refused(seen[i])]
    if len(kept) == done or not replay(prefix + [steps[i] for i in kept]).success:
        kept = list(range(done))   # nothing refused, or the goal needs a refused step: the next pass decides
    refused_cut, position, unneeded = done - len(kept), 0, 0
    while position < len(kept):
        trial = kept[:position] + kept[position + 1:]
        if trial and replay(prefix + [steps[i] for i in trial]).success:
            kept, unneeded = trial, unneeded + 1
        else:
            position += 1
    final = replay(prefix + [steps[i] for i in kept])
    if not final.success or final.steps != len(prefix) + len(kept):
        return None
    return Cleaned(kept, final.observations[len(prefix):], refused_cut, unneeded, len(steps) - done)


def clean_row(row: dict, replayer: Replayer, report: CleanReport) -> Optional[dict]:
    """The row with its continuation cleaned; None where it is left out."""
    messages = row["revise_log"]
    pairs = pairs_of(messages)
    trained = [i for i, (turn, _) in enumerate(pairs) if turn.get("loss", True)]
    if not trained:
        return row
    start = trained[0]
    revision = "high_log" in row                   # a spliced row: its first trained turn is the revision turn
    fixed = pairs[:start + 1] if revision else pairs[:start]
    continuation = pairs[len(fixed):]
    prefix = [parse_action(turn["content"]) for turn, _ in pairs[:start]]   # the revision wait is not stepped
    steps = [parse_action(turn["content"]) for turn, _ in continuation]
    task = int(row["task_num"])
    replay = lambda actions: replayer(task, actions)  # noqa: E731
    if revision:
        report.spliced += 1
        as_recorded = replay(prefix + steps)
        recorded = [obs["content"].strip() for _, obs in continuation]
        got = [o.strip() for o in as_recorded.observations[len(prefix):]]
        report.spliced_as_recorded += got == recorded[:len(got)] and len(got) == len(recorded)
    cleaned = clean_continuation(replay, prefix, steps, replayer.spec.refused)
    if cleaned is None:
        report.left_out += 1
        return None
    body = [m for turn, obs in fixed for m in (dict(turn), dict(obs))]
    for i, observation in zip(cleaned.kept, cleaned.observations):
        body += [dict(continuation[i][0]), {**continuation[i][1], "content": observation}]
    report.kept += 1
    report.steps_before += len(steps)
    report.refused_cut += cleaned.refused
    report.unneeded_cut += cleaned.unneeded
    report.after_goal_cut += cleaned.after_goal
    return {**row, "revise_log": [dict(m) for m in messages[:HEAD_LEN]] + body, "cleaned": True}


def clean_rows(rows: list[dict], server_for: Callable[[str], str]) -> tuple[list[dict], CleanReport]:
    """Every row cleaned (in order), rows whose replay misses the goal left
    out; ``server_for(task)`` is the env server that replays a task's rows."""
    report = CleanReport(rows=len(rows))
    replayers: dict[str, Replayer] = {}
    out = []
    try:
        for row in tqdm(rows, desc="clean paths", unit="row", disable=not rows):
            task = row.get("env") or "textcraft"
            if task not in replayers:
                replayers[task] = Replayer(get_env(task), server_for(task))
            cleaned = clean_row(row, replayers[task], report)
            if cleaned is not None:
                out.append(cleaned)
    finally:
        for replayer in replayers.values():
            replayer.close()
    return out, report


def servers(spec: Optional[str]) -> Callable[[str], str]:
    """``--env_server_base`` of the export: one URL for every task, or
    ``task=url`` pairs (comma-separated); unset: each task's local server."""
    table: dict[str, str] = {}
    single: Optional[str] = None
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, eq, url = part.partition("=")
        if eq and not name.startswith("http"):
            table[get_env(name).name] = url
        else:
            single = part
    return lambda task: table.get(task) or single or get_env(task).default_server

