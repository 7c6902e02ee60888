"""The knob groups several scripts share: each environment variable here is
declared once, with one help text, one minimum and one default.

A reference script includes the groups it reads as fields of its own settings
class (dataclass inheritance): ``SearchSettings(SearchKnobs)`` still has
``settings.iterations`` and writes a flat manifest, as before. ``iterate.py``
nests whole groups (``IterateSettings.search``) and hands each stage the same
group's values, so a knob means the same in the loop as in its script.
The training knobs live with the trainers (``agent_r/training/settings.py``)
and MODEL_DIR with the backend settings (``agent_r/settings.py``).

Three knobs fall back differently per reference script, as those scripts
promise; their one declaration is unset by default and each script's
``finish()`` fills in its fallback, named here:

* TASK: mcts_collection.py and iterate.py search ``DEFAULT_TASK``;
  path_collection.py and eval.py need it set.
* TEMP: the policy samples at ``POLICY_TEMPERATURE`` in search and eval;
  path_collection.py's verifier has its own field (``--verifier_temperature``)
  that takes TEMP when set, else ``VERIFIER_TEMPERATURE`` (greedy).
* MAX_TOKEN_LENGTH: ``PROMPT_BUDGET`` for search and the verifier,
  ``EVAL_PROMPT_BUDGET`` for eval (the reference eval's budget).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from agent_r.settings import DEFAULT_MAX_TOKEN_LENGTH, setting
from agent_r.tree import EXPLORATION_C

DEFAULT_TASK = "textcraft"
POLICY_TEMPERATURE = 1.0
VERIFIER_TEMPERATURE = 0.0
PROMPT_BUDGET = DEFAULT_MAX_TOKEN_LENGTH
EVAL_PROMPT_BUDGET = 7000
WAIT_REPLIES = ("env", "ok")     # WAIT_REPLY: who answers the revision turn's ``wait`` in eval


@dataclass
class TaskChoice:
    """Which environment a script works on."""

    task: Optional[str] = setting(None, env="TASK", flag=None,
                                  help="the environment: textcraft, sciworld or webshop (iterate.py: several, "
                                  f"comma-separated) (default: {DEFAULT_TASK} for mcts_collection.py and "
                                  "iterate.py; path_collection.py and eval.py need it)")


@dataclass
class Temperature:
    """The policy's sampling temperature."""

    temperature: Optional[float] = setting(None, env="TEMP", flag=None, minimum=0.0,
                                           help=f"the sampling temperature (default {POLICY_TEMPERATURE:g}, the "
                                           "reference's decoding, in search and eval; path_collection.py's "
                                           "verifier takes TEMP when set, else 0 = greedy)")

    def resolve_temperature(self) -> None:
        if self.temperature is None:
            self.temperature = POLICY_TEMPERATURE


@dataclass
class PromptBudget:
    """How many tokens a prompt may hold before its oldest turns are dropped."""

    max_token_length: Optional[int] = setting(None, env="MAX_TOKEN_LENGTH", flag=None, minimum=100,
                                              help="the prompt budget in tokens; older turns are dropped above it "
                                              f"- 60 (default {PROMPT_BUDGET}; eval.py {EVAL_PROMPT_BUDGET}, the "
                                              "reference eval's)")

    def resolve_prompt_budget(self, fallback: int = PROMPT_BUDGET) -> None:
        if self.max_token_length is None:
            self.max_token_length = fallback


@dataclass
class WaitReply:
    """Who answers the revision turn's ``wait`` in an evaluated episode
    (eval.py, iterate.py's evals). Training samples follow it with the reply
    ``ok.`` (agent_r.revision.REVISION_REPLY), but a test-time env answers an
    action it does not know (TextCraft: "Could not execute wait"). ``env``
    keeps the env's answer (the faithful setting); ``ok`` sends no revision
    ``wait`` to the env and shows the model the training reply instead, the
    turn still counting toward the turn limit."""

    wait_reply: str = setting("env", env="WAIT_REPLY", choices=WAIT_REPLIES,
                              help="who answers the revision turn's `wait` in eval: env (the environment, as "
                              "AgentGym does) or ok (not sent; the model sees the training samples' reply `ok.`; "
                              "results go to a folder ending _wait_ok) (default env)")


@dataclass
class SearchKnobs(Temperature):
    """How one MCTS tree is grown (mcts_collection.py, iterate.py's search)."""

    max_depth: Optional[int] = setting(None, env="MAX_DEPTH", flag=None, minimum=0,
                                       help="the depth beyond which a node is terminal (default per task: "
                                       "textcraft 20, sciworld 30, webshop 10)")
    iterations: int = setting(8, env="ITERA", flag=None, minimum=1,
                              help="the number of MCTS iterations per tree (default 8)")
    n_gen: int = setting(4, env="N_GEN", flag=None, minimum=1,
                         help="the number of model samples per expansion, one request with n=N_GEN (default 4)")
    c: float = setting(EXPLORATION_C, flag="--exploration_c", minimum=0.0,
                       help=f"the UCT exploration constant (default {EXPLORATION_C}, the paper's)")


@dataclass
class PairKnobs:
    """Which (good, bad) leaf-path pairs of a tree become revision samples
    (path_collection.py, iterate.py's data stage)."""

    alpha: Optional[float] = setting(None, env="ALPHA", flag=None, schedule=True,
                                     help="the score a good path's leaf must exceed, on the task's score scale; "
                                     "iterate.py also takes one value per iteration, comma-separated (0.5,0.7,1.0; "
                                     "one-iteration scripts use the first) (default: the task's value, agent_r/envs; "
                                     "iterate.py: 0.5, 0.7, 1.0 x the task's max score in iterations 1, 2, 3+, the "
                                     "paper's; a value >= the max score keeps only max-score leaves there)")
    beta: Optional[float] = setting(None, env="BETA", flag=None, minimum=0.0,
                                    help="the score gap a (good, bad) pair must exceed, on the task's score scale "
                                    "(default: the task's value, agent_r/envs)")
    max_pairs_per_tree: int = setting(0, minimum=0, help="pairs kept per tree after the seeded shuffle, 0 = all "
                                      "as the reference (default 0)")
