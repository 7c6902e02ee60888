"""One evaluation episode as a job of the batch driver (agent_r.driver).

``Episode.run(client)`` is a generator: reset the env to the task (replaying
a failed prefix first for the revision task), then per step yield one request
for the next model turn and step the parsed action, until the env says done,
a disaster (negative reward: the episode ends with score 0) or ``max_steps``
model turns (a task's sampled episodes, ``eval.py --samples``, are
episodes of their own). With ``wait_reply="ok"`` a revision ``wait``
(agent_r.revision.is_revision_wait; a replayed one too) never reaches the
env: the episode answers it with the training samples' reply, as a turn like
any other (it counts toward ``max_steps`` and ``step_num``). The driver
answers the requests of every live episode with one model call. Each request
carries a seed derived from (seed, episode key, model step), so a deterministic
backend gives the same trajectory at any concurrency, after an env restart and
after a resume. The run around it (resume, result files,
manifest, summary) is agent_r/evaluation.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, NamedTuple, Optional

from agent_r import conversation as conv
from agent_r.envs import EnvSpec
from agent_r.llm import GenerationRequest, derive_seed
from agent_r.revision import REVISION_REPLY, is_revision_wait


class Task(NamedTuple):
    """One episode to run: a task index, optionally a failed prefix to replay,
    and which of a task's sampled episodes it is (``eval.py --samples``)."""

    idx: int
    key: str                            # result file key: "12", "12_0" for a revise row, "12_s3" for sample 3
    prefix_turns: tuple[str, ...] = ()
    sample: Optional[int] = None        # None: the task's only episode

    @property
    def task_key(self) -> str:
        """The key of the task this episode samples (its own key when it is the only one)."""
        return self.key if self.sample is None else self.key.removesuffix(f"_s{self.sample}")

    def sampled(self, j: int) -> "Task":
        """Episode ``j`` of this task: its own key, so its own result file and its own request seeds."""
        return Task(self.idx, f"{self.key}_s{j}", self.prefix_turns, j)


@dataclass(frozen=True)
class EpisodeSetup:
    """What every episode of a run shares."""

    spec: EnvSpec
    model_name: str
    max_steps: int
    seed: int
    wait_reply: str = "env"             # "ok": the revision wait gets REVISION_REPLY, not the env's answer


class _Trajectory:
    """An episode's state so far; turned into the result file at its end."""

    def __init__(self, task: Task, setup: EpisodeSetup, client: Any):
        self.task, self.setup, self.client = task, setup, client
        self.messages: list[dict] = []
        self.step_num = 0          # env steps taken (replayed + model)
        self.model_steps = 0       # steps the evaluated model chose
        self.wait_replies = 0      # revision waits answered with REVISION_REPLY instead of the env
        self.score = 0.0

    def act(self, turn: str) -> str | None:
        """Step one turn's action; how the episode ended, or None."""
        spec = self.setup.spec
        if self.setup.wait_reply == "ok" and is_revision_wait(turn, spec.name):
            self.step_num += 1
            self.wait_replies += 1
            self.messages = conv.append_turn(self.messages, turn, REVISION_REPLY)
            return None
        out = self.client.step(spec.prepare_action(self.client, conv.parse_action(turn)))
        self.step_num += 1
        self.messages = conv.append_turn(self.messages, turn, out.state)
        scored = spec.step_score(out.reward)
        self.score = scored.score
        return "disaster" if scored.disaster else "done" if out.done else None

    def result(self, ended_by: str, error: str | None = None) -> dict[str, Any]:
        failed = ended_by == "error"
        result = {
            "task_id": self.task.idx,
            "env_score": 0.0 if failed else self.score,
            "model_name": self.setup.model_name,
            "step_num": self.step_num,
            "state": self.messages,
            "success": not failed and self.setup.spec.is_success(self.score),
            "ended_by": ended_by,
            "model_steps": self.model_steps,
            "replayed_steps": len(self.task.prefix_turns),
            "wait_replies": self.wait_replies,
            "error": error,
        }
        if self.task.sample is not None:   # a one-episode run's files keep the reference's fields only
            result.update(task_key=self.task.task_key, sample=self.task.sample)
        return result


class Episode:
    """A driver job: reset, replay the revise prefix, then one model turn per
    request until done, a disaster or ``max_steps`` model turns. The driver
    reruns ``run`` from scratch on a fresh client after an env error."""

    def __init__(self, task: Task, setup: EpisodeSetup):
        self.task, self.setup = task, setup
        self.key = task.key
        self._last: _Trajectory | None = None   # the latest attempt, for the failure record

    def run(self, client: Any) -> Generator[GenerationRequest, list[str], dict[str, Any]]:
        traj = self._last = _Trajectory(self.task, self.setup, client)
        client.reset(self.task.idx)
        traj.messages = conv.initial_conversation(client.instruction, client.observe())
        for turn in self.task.prefix_turns:
            ended = traj.act(turn)
            if ended:
                return traj.result(ended)
        while True:
            samples = yield GenerationRequest(traj.messages, n=1,
                                              seed=derive_seed(self.setup.seed, self.key, traj.model_steps))
            traj.model_steps += 1
            ended = traj.act(samples[0])
            if ended or traj.model_steps >= self.setup.max_steps:
                return traj.result(ended or "step_limit")

    def failed(self, exc: BaseException) -> dict[str, Any]:
        """The result file of an episode whose env kept failing: the last
        attempt's trajectory, score 0; a rerun redoes it."""
        traj = self._last or _Trajectory(self.task, self.setup, None)
        return traj.result("error", error=f"{type(exc).__name__}: {exc}")
