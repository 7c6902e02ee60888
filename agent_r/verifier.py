"""The verifier: the policy model judging each step of a low-scoring path
as Good, Bad or Uncertain, so the bad prefix of a revision sample ends at the
first step it calls Bad.

The prompt shows the task, every earlier step (action and observation) and
the step to judge, and asks for reasons then a last line ``Judgment: <label>``;
only the label right after the last such marker counts (``Judgement`` is
accepted too), and a reply without one reads as Uncertain, counted.

Why batching is safe: a step's judgement depends only on the task and the
steps before it, never on later judgements. So every step of every distinct
low path can be judged in one batched model call, and "keep steps until the
first Bad" is then applied to the finished judgements; the result equals
walking the path step by step, with one model call instead of one per step.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Protocol, Sequence

from agent_r.conversation import TRUNCATION_MARGIN, Message
from agent_r.driver import generate_checked
from agent_r.llm import Backend, GenerationRequest, SamplingConfig
from agent_r.tree import Node

GOOD, BAD, UNCERTAIN = "Good", "Bad", "Uncertain"


class VerifierSettings(Protocol):
    """What the verifier reads of a run's settings (agent_r.revision.RevisionConfig has it)."""

    verifier_temperature: float
    max_new_tokens: int
    max_token_length: int   # prompt budget (minus 60): the oldest earlier steps are dropped to fit


_JUDGMENT = re.compile(r"judge?ment\s*:", re.IGNORECASE)
# the label word, optionally wrapped in markdown/quotes/brackets; a list of
# alternatives (an echo of the instruction: "<Good|Bad|Uncertain>") is not a label
_LABEL = re.compile(r"[\s*_\"'`\[\(<]*(good|bad|uncertain)\b"
                    r"(?!\s*(?:[|/]|,\s*(?:good|bad|uncertain)\b|or\s+(?:good|bad|uncertain)\b))", re.IGNORECASE)


def parse_judgement(reply: str) -> str | None:
    """The label right after the LAST `Judgment:`/`Judgement:` marker, or None.
    Only that word counts, so "Judgment: not good" is unparseable, not Good."""
    markers = list(_JUDGMENT.finditer(reply))
    if not markers:
        return None
    m = _LABEL.match(reply, markers[-1].end())
    return m.group(1).capitalize() if m else None


def verifier_messages(task: str, history: Sequence[tuple[str, str]], action: str, obs: str,
                      step_no: int) -> list[Message]:
    """The prompt judging step ``step_no`` (1-based) after ``history``, the
    (action, observation) steps before it that fit."""
    if history:
        earlier = "\n".join(f"Step {i} action: {a}\nStep {i} observation: {o}"
                            for i, (a, o) in enumerate(history, start=step_no - len(history)))
    else:
        earlier = "(none: this is the first step)"
    prompt = (
        "You are checking the work of an agent that acts in a text environment to complete a task.\n\n"
        f"The task:\n{task}\n\n"
        f"What the agent did before:\n{earlier}\n\n"
        f"The step to check (step {step_no}):\nAction: {action}\nObservation: {obs}\n\n"
        "Is this step a sensible move toward completing the task? Call it Good if it helps, Bad if it is a "
        "mistake (an action that fails, wastes steps, or heads away from the goal), and Uncertain if you "
        "cannot tell yet. First give your reasons in a few sentences. Then finish with one last line "
        "of this form, choosing one word:\nJudgment: <Good|Bad|Uncertain>"
    )
    return [{"role": "system", "content": "You are a careful reviewer of agent trajectories."},
            {"role": "user", "content": prompt}]


def fit_history(backend: Backend, cfg: VerifierSettings, task: str, history: list[tuple[str, str]],
                action: str, obs: str, step_no: int) -> list[Message]:
    """Drop the oldest earlier steps until the prompt fits MAX_TOKEN_LENGTH - 60."""
    budget = backend.prompt_budget(cfg.max_token_length, cfg.max_new_tokens) - TRUNCATION_MARGIN
    while True:
        messages = verifier_messages(task, history, action, obs, step_no)
        if not history or backend.count_tokens(messages) <= budget:
            return messages
        history = history[1:]


@dataclass
class Verdict:
    """Judgements of a low path's steps, in order, and where the bad prefix ends."""

    labels: list[str]
    replies: list[str]
    unparseable: int
    cut: int            # length of the bad prefix
    first_bad: int | None  # 1-based position of the first Bad step, None if no step was Bad


def make_verdict(labels: list[str | None], replies: list[str]) -> Verdict:
    """A path's verdict from its steps' labels (None: unparseable, read as Uncertain)."""
    clean = [label or UNCERTAIN for label in labels]
    first_bad = next((i for i, label in enumerate(clean) if label == BAD), None)
    cut = len(clean) if first_bad is None else first_bad + 1
    return Verdict(clean, replies, sum(label is None for label in labels), cut,
                   None if first_bad is None else first_bad + 1)


def verify_paths(backend: Backend, cfg: VerifierSettings,
                 jobs: list[tuple[str, list[Node], int]]) -> tuple[list[Verdict], list[tuple[int, int]]]:
    """Judge every step of every path in ``jobs`` ((task, path, seed) each) with
    ONE batched generate call. Identical prompts (steps shared by two paths)
    are sent once. Returns one Verdict per job and, per job, (prompts it added
    to the batch, how many of their replies were unparseable); summed over jobs
    these are the prompts sent and the unparseable replies received."""
    requests, per_job, new = _verifier_requests(backend, cfg, jobs)
    if not requests:
        return [], [(0, 0) for _ in jobs]
    sampling = SamplingConfig(temperature=cfg.verifier_temperature, max_new_tokens=cfg.max_new_tokens)
    # prompts are already fitted step by step (fit_history), so no truncation here
    # a prompt that cannot fit the model fails alone: its step reads as unparseable (Uncertain)
    replies = [out[0] if isinstance(out, list) else "" for out in
               generate_checked(backend, requests, sampling, allow_failures=True)]
    labels = [parse_judgement(r) for r in replies]
    verdicts = [make_verdict([labels[i] for i in indices], [replies[i] for i in indices]) for indices in per_job]
    return verdicts, [(len(r), sum(labels[i] is None for i in r)) for r in new]


def _verifier_requests(backend: Backend, cfg: VerifierSettings, jobs: list[tuple[str, list[Node], int]]
                       ) -> tuple[list[GenerationRequest], list[list[int]], list[range]]:
    """(distinct requests, per job the request index of each of its steps, per
    job the range of requests it was first to add)."""
    prompts: dict[str, int] = {}
    requests: list[GenerationRequest] = []
    per_job: list[list[int]] = []
    new: list[range] = []
    for task, path, seed in jobs:
        indices, history, before = [], [], len(requests)
        for step_no, node in enumerate(path, start=1):
            messages = fit_history(backend, cfg, task, list(history), node.action, node.obs, step_no)
            key = repr(messages)
            if key not in prompts:
                prompts[key] = len(requests)
                requests.append(GenerationRequest(messages=messages, n=1,
                                                  seed=zlib.crc32(f"{seed}:{key}".encode()) & 0x7FFFFFFF))
            indices.append(prompts[key])
            history.append((node.action, node.obs))
        per_job.append(indices)
        new.append(range(before, len(requests)))
    return requests, per_job, new
