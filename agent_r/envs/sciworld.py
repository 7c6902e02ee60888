"""ScienceWorld: science experiments in a text world. Scores 0-100; a failed
task is a -100 reward (a disaster). The splits hold out variations
(agent_r/splits), and the search walks task numbers rather than index ranges.
Our server numbers games exactly as AgentGym's does, so the paper's AgentEval
test list is the default on both."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from agent_r.envs.spec import AGENT_R, AGENTGYM, EnvSpec, Split
from agent_r.settings import UsageError
from agentenv_client import SciworldEnvClient

# ScienceWorld task numbers (positions in its task-name list) the search trains
# on: the 23 task types AgentGym's server serves. The other 7 positions are the task types AgentGym's server
# excludes, so the test split is by variation (see agent_r/splits).
SCIWORLD_TRAIN_TASK_NUMS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 18, 19, 20, 21, 22, 25, 26, 27, 28, 29)
# The order in which the reference's mcts_collection.py walked them (--min/--max
# slice this list for SciWorld).
SCIWORLD_SEARCH_ORDER = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 18, 19, 20, 21, 22, 25, 26, 27, 28, 29, 0)


@dataclass(frozen=True)
class SciworldSpec(EnvSpec):
    def prepare_action(self, client, action: str) -> str:
        """Free text is mapped onto the closest valid action before stepping."""
        return client.map_to_valid_action(action)

    def history_entry(self, action: str, observation: str) -> Any:
        """The reference's string form ``"(action, observation)"``."""
        return f"({action}, {observation})"

    def search_candidates(self, settings: Any, server: str, split: Split) -> tuple[list[int], str]:
        """Positions 1..--task_iteration of each task number (the guard in
        ``EnvSpec.search_indices`` then drops the split's test ids)."""
        nums = ([settings.task_num] if settings.task_num is not None
                else list(SCIWORLD_SEARCH_ORDER[settings.min:settings.max]))
        with self.make_client(server) as client:
            game_nums = client.game_nums()
        chosen = sciworld_train_indices(game_nums, nums, settings.task_iteration)
        return chosen, f"task numbers {nums} x positions 1..{settings.task_iteration}"


def sciworld_train_indices(game_nums: dict, task_nums: Sequence[int], task_iteration: int) -> list[int]:
    """SciWorld search tasks as the reference chose them: for each task number
    (a position in ScienceWorld's task-name list) the global indices at
    positions 1..task_iteration of its variation list (``game_nums`` maps task
    number -> global indices, as the server's /game_nums returns it; position 0
    is skipped, as in the reference). Task numbers the server does not serve
    are an error."""
    nums = {int(k): list(v) for k, v in game_nums.items()}
    out: list[int] = []
    for t in task_nums:
        if not nums.get(t):
            served = sorted(k for k, v in nums.items() if v)
            raise UsageError(
                f"SciWorld task number {t} is not served by the env server (it serves {served}); "
                "pick --task_num from those"
            )
        out.extend(nums[t][1:task_iteration + 1])
    return out


GAMES = 4639   # AgentGym's game list with scienceworld 1.2.3 (7,207 variations less the excluded task types)

SCIWORLD = SciworldSpec(
    name="sciworld", default_server="http://127.0.0.1:36002", data_len=GAMES, client_class=SciworldEnvClient,
    splits=(
        Split("agenteval", test="sciworld_agenteval_test.json", train=None, servers=(AGENTGYM, AGENT_R), tasks=GAMES,
              about="the paper's AgentEval test list: 200 ids"),
        Split("project", test="sciworld_test.json", train=None, servers=(AGENTGYM, AGENT_R), tasks=GAMES,
              about="the first 10 ScienceWorld test variations of each of the 23 served task types (201)"),
    ),
    max_score=100.0, max_depth=30, alpha=50.0, beta=30.0,
    refusal_pattern=r"No known action matches that input",   # ScienceWorld's parser, for any unknown command
)
