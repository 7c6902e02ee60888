"""A task counts as solved only at the environment's full score: a SciWorld
episode that ends at 33 of 100 is not a success, one at 100 is. This holds
wherever success is counted: an episode's result file, the summary of result
files that carry no success flag (the reference's), a search's successful
leaves, the viewer's leaf colour and the demo's summary of a loop run."""
from __future__ import annotations

import json

import pytest

from agent_r import report, view
from agent_r.envs import get_env
from agent_r.episode import Episode, EpisodeSetup, Task
from agent_r.mcts import MCTSConfig, TreeSearch
from agent_r.tree import load_tree
from agentenv_client import StepOutput
from scripts.demo_summary import summarize
from tests.support import tree_fixtures as tf

SCIWORLD = get_env("sciworld")


class ScoreDouble:
    """A SciWorld client double whose first step ends the task at ``score``
    (ScienceWorld reports the task's cumulative score, 0-100)."""

    instruction = "You are a scientist."

    def __init__(self, score: float):
        self.score = score

    def reset(self, idx: int) -> None:
        pass

    def observe(self) -> str:
        return "Your task is to boil water."

    def map_to_valid_action(self, action: str) -> str:
        return action

    def step(self, action: str) -> StepOutput:
        return StepOutput(state="The water boils.", reward=self.score, done=True)


def finish(generator, turn: str = "Thought: heat it.\nAction: activate stove"):
    """Run a driver job by hand: answer its one request with ``turn``."""
    next(generator)
    with pytest.raises(StopIteration) as stop:
        generator.send([turn])
    return stop.value.value


@pytest.mark.parametrize("score,solved", [(33.0, False), (99.0, False), (100.0, True)])
def test_an_episode_succeeds_only_at_the_full_score(score, solved):
    result = finish(Episode(Task(0, "0"), EpisodeSetup(SCIWORLD, "m", 5, 0)).run(ScoreDouble(score)))
    assert (result["env_score"], result["ended_by"], result["success"]) == (score, "done", solved)


def test_reference_result_files_count_success_by_the_full_score():
    rows = [{"task_id": i, "env_score": s, "step_num": 1, "state": []} for i, s in enumerate((33.0, 100.0, 0.0))]
    summary = report.summarize(rows, max_score=SCIWORLD.max_score)
    assert summary["success_rate"] == pytest.approx(1 / 3) and summary["score_x100"] == pytest.approx(133 / 3)


@pytest.mark.parametrize("score,solved", [(33.0, 0), (100.0, 1)])
def test_a_search_counts_only_full_score_leaves_as_successful(score, solved):
    search = TreeSearch(0, SCIWORLD, MCTSConfig(iterations=1, n_gen=1, max_depth=3))
    root = finish(search.run(ScoreDouble(score)))
    (leaf,) = root.children
    assert leaf.is_terminal and leaf.env_score == score and root.value == score
    assert (search.stats.leaves, search.stats.successful_leaves) == (1, solved)


def test_the_viewer_colours_only_full_score_leaves_as_successes(tmp_path):
    tree = tf.write_tree(tf.tree_scored([100.0, 33.0]), tmp_path / "sciworld" / "m", 4)
    kinds = [n["kind"] for n in view.page_data(load_tree(tree), tree, None)["nodes"][1:]]
    assert kinds == ["success", "fail"]


def test_the_demo_summary_counts_only_full_score_leaves(tmp_path):
    run = tmp_path / "run"
    trees = run / "iter_1" / "trees" / "base" / "sciworld" / "base"
    tf.write_tree(tf.tree_scored([33.0]), trees, 0)
    tf.write_tree(tf.tree_scored([100.0, 33.0]), trees, 1)
    (run / "results.json").write_text(json.dumps({"rows": []}))
    got = summarize(run)
    assert (got["trees"], got["leaves"], got["successful_leaves"], got["trees_with_success"]) == (2, 3, 1, 1)
