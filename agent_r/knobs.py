"""The knob groups several scripts share: each environment variable here is
declared once, with one help text, one minimum and one default.

What every script that runs a model shares: ``ModelDir`` (MODEL_DIR, the
model a backend loads and a trainer starts from; ``BUNDLED_MODEL_DIR`` by
default), ``BackendSettings`` (how to reach the model) with
``resolved_model_name``, ``ShardSettings`` (which share of a run's tasks a
process takes), and the one-field helpers (``seed_setting``,
``max_new_tokens_setting``, ``concurrency_setting``, ``env_server_setting``).
What several scripts of the pipeline share: the task, temperature, prompt
budget and wait-reply knobs, ``SearchKnobs`` and ``PairKnobs``. The machinery
that declares and parses fields (``setting``, ``parse``) is
``agent_r/settings.py``; the training knobs live with the trainers
(``agent_r/training/settings.py``).

A reference script includes the groups it reads as fields of its own settings
class (dataclass inheritance): ``SearchSettings(SearchKnobs)`` still has
``settings.iterations`` and writes a flat manifest, as before. ``iterate.py``
nests whole groups (``IterateSettings.search``) and hands each stage the same
group's values (``group_values``), so a knob means the same in the loop as in
its script.

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

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from agent_r.settings import UsageError, setting
from agent_r.tree import EXPLORATION_C


# --------------------------------------------------------------------------- model, backend, shards

DEFAULT_MAX_NEW_TOKENS = 500   # the paper's limit on new tokens per model turn
DEFAULT_MAX_TOKEN_LENGTH = 4096
BUNDLED_MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "textcraft-tiny"


def seed_setting() -> Any:
    return setting(0, help="the run seed: sampling seeds and tie-breaks derive from it (default 0)")


def max_new_tokens_setting(what: str = "one model turn") -> Any:
    return setting(DEFAULT_MAX_NEW_TOKENS, minimum=1, help=f"the token limit of {what} (default {DEFAULT_MAX_NEW_TOKENS})")


def concurrency_setting(what: str) -> Any:
    return setting(8, minimum=1, help=f"the {what} at once; their model turns share one batched call (default 8; "
                   "results do not depend on it)")


def env_server_setting() -> Any:
    return setting(None, help="the env server URL (default: the task's local server, e.g. http://127.0.0.1:36001 "
                   "for textcraft)")


def group_values(group: Any) -> dict[str, Any]:
    """A settings group's field values by name (not copied deeper): how the
    loop hands a nested group to a script's settings, which include the same
    group's fields."""
    return {f.name: getattr(group, f.name) for f in fields(group)}


@dataclass
class ModelDir:
    """MODEL_DIR, the one model setting of every script: the model a backend
    loads and the model a trainer starts from."""

    model_dir: str | None = setting(None, env="MODEL_DIR", flag=None, help="the model: a Hugging Face directory "
                                    "or hub id (default: the bundled models/textcraft-tiny)")


@dataclass
class BackendSettings(ModelDir):
    """How to reach the model; every script that calls a model nests this."""

    backend: str | None = setting(None, env="BACKEND", help="the model backend: vllm | hf | openai | "
                                  "python:MODULE:FACTORY (default: vllm when installed, else hf)")
    model_name: str | None = setting(None, env="MODEL_NAME", help="the model's name in output paths and for "
                                     "the openai backend (default: the last part of MODEL_DIR)")
    instruction_file: str | None = setting(None, env="AGENTENV_INSTRUCTION_FILE", flag=None,
                                           help="a file whose text replaces the bundled env instruction")
    dtype: str = setting("auto", help="weights dtype for hf/vllm: auto (GPU: hf bf16, vllm its own auto, the "
                         "model's dtype with fp32 weights as bf16; CPU: bf16 for a model saved in bf16 where the CPU "
                         "has native bf16 (AMX or AVX512-BF16), else fp32), bfloat16, float16, float32 (default auto)",
                         choices=("auto", "bfloat16", "float16", "float32"))
    tensor_parallel_size: int = setting(1, minimum=1, help="vllm: GPUs one model is split over (default 1)")
    gpu_memory_utilization: float = setting(0.9, minimum=0.05, help="vllm: fraction of GPU memory the engine "
                                            "may take (default 0.9)")
    max_model_len: int | None = setting(None, minimum=1, help="vllm: engine context length (default: "
                                        "the prompt budget + max_new_tokens, capped at the model's limit)")
    kv_cache_gib: float | None = setting(None, minimum=0.01, help="vllm: KV-cache size in GiB instead of the "
                                         "--gpu_memory_utilization share (default: that share on GPU; 2 on CPU, "
                                         "where the share would reserve that fraction of the machine's RAM)")
    hf_batch_size: int = setting(0, minimum=0, help="hf: sequences per generate call; 0 (default) = all of a "
                                 "call's sequences on a GPU, 16 on CPU")
    hf_cache_gib: float = setting(4.0, minimum=0, help="hf: GiB of keys/values kept between calls, so a turn that "
                                  "extends an earlier prompt + reply computes only its new tokens; 0 = off "
                                  "(default 4)")
    allow_cpu: bool = setting(False, env="ALLOW_CPU", help="hf/vllm: run a model over ~1B parameters on CPU anyway "
                              "(default 0: refuse; no usable GPU usually means a broken CUDA setup)")
    openai_base_url: str | None = setting(None, env="OPENAI_BASE_URL", flag=None,
                                          help="openai: endpoint URL, e.g. http://127.0.0.1:8000/v1")
    openai_api_key: str | None = setting(None, env="OPENAI_API_KEY", flag=None, secret=True,
                                         help="openai: API key (never written anywhere)")
    openai_timeout: float = setting(120.0, env="OPENAI_TIMEOUT", flag=None, minimum=0.001,
                                    help="openai: seconds one request may take (default 120)")
    openai_concurrency: int = setting(16, env="OPENAI_CONCURRENCY", flag=None, minimum=1,
                                      help="openai: requests in flight at once (default 16)")
    openai_max_retries: int = setting(5, env="OPENAI_MAX_RETRIES", flag=None, minimum=0,
                                      help="openai: retries of a failed request (default 5)")
    azure_endpoint: str | None = setting(None, env="AZURE_OPENAI_ENDPOINT", flag=None,
                                         help="openai: an Azure OpenAI endpoint (used instead of OPENAI_BASE_URL)")
    azure_api_key: str | None = setting(None, env="AZURE_OPENAI_API_KEY", flag=None, secret=True,
                                        help="openai: the Azure API key")
    azure_api_version: str = setting("2024-06-01", env="OPENAI_API_VERSION", flag=None,
                                     help="openai: Azure API version (default 2024-06-01)")


def resolved_model_name(backend: BackendSettings, bundled_name: str) -> str:
    """The model's name in output paths: --model_name / MODEL_NAME, else the
    last part of MODEL_DIR, else the bundled model's name."""
    if backend.model_name and backend.model_name.strip():
        return backend.model_name.strip()
    if backend.model_dir and backend.model_dir.strip():
        return os.path.basename(os.path.normpath(backend.model_dir.strip()))
    return bundled_name


@dataclass
class ShardSettings:
    """Which share of a run's tasks this process takes: data-parallel search and
    eval over GPUs and nodes with no coordinator (docs/cluster.md). Inside a
    SLURM array job the shard defaults from the array (``--array=0-(N-1)``)."""

    shard_index: int | None = setting(None, env="SHARD_INDEX", minimum=0,
                                      help="this process's shard, 0..num_shards-1: it takes every num_shards-th "
                                      "task of the run's list from position shard_index (default: "
                                      "SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN in a SLURM array job, else 0)")
    num_shards: int | None = setting(None, env="NUM_SHARDS", minimum=1,
                                     help="the number of shards the run's tasks are split into (default: "
                                     "SLURM_ARRAY_TASK_COUNT in a SLURM array job, else 1)")
    slurm_array_task_id: int | None = setting(None, env="SLURM_ARRAY_TASK_ID", flag=None, minimum=0,
                                              help="set by SLURM in an array job: the default shard index")
    slurm_array_task_min: int | None = setting(None, env="SLURM_ARRAY_TASK_MIN", flag=None, minimum=0,
                                               help="set by SLURM: the array's first task id")
    slurm_array_task_count: int | None = setting(None, env="SLURM_ARRAY_TASK_COUNT", flag=None, minimum=1,
                                                 help="set by SLURM: the array's size, the default number of shards")
    slurm_array_task_step: int | None = setting(None, env="SLURM_ARRAY_TASK_STEP", flag=None, minimum=1,
                                                help="set by SLURM: the array's id step (must be 1 for sharding)")

    def finish(self) -> None:
        """Resolve the SLURM defaults and check the pair (idempotent)."""
        in_array = self.slurm_array_task_id is not None and self.slurm_array_task_count is not None
        if self.num_shards is None:
            self.num_shards = self.slurm_array_task_count if in_array else 1
        if self.shard_index is None:
            self.shard_index = self.slurm_array_task_id - (self.slurm_array_task_min or 0) if in_array else 0
            if in_array and (not 0 <= self.shard_index < self.num_shards or (self.slurm_array_task_step or 1) != 1):
                raise UsageError(f"SLURM array task {self.slurm_array_task_id} of {self.num_shards} cannot be a shard: "
                                 f"sharding needs consecutive array ids (--array=0-{self.num_shards - 1}, no step "
                                 "or gaps); or set SHARD_INDEX and NUM_SHARDS yourself.")
        if self.shard_index >= self.num_shards:
            raise UsageError(f"--shard_index={self.shard_index} is not below --num_shards={self.num_shards}: "
                             f"shards are numbered 0..{self.num_shards - 1}.")


# --------------------------------------------------------------------------- pipeline knobs

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
class EvalSamples:
    """Episodes per test task (eval.py, iterate.py's sampled eval). One
    greedy episode a task is the paper's measure; K sampled episodes give
    Pass@k (agent_r/passk.py), which tells widening from sharpening."""

    eval_samples: int = setting(1, env="EVAL_SAMPLES", flag="--samples", minimum=1,
                                help="episodes per test task, K (default 1, the paper's): K > 1 samples K episodes "
                                "of each task at a temperature > 0, each with its own seeds, and reports Pass@k for "
                                "k = 1, 2, 4, ... K (eval.py: into a folder ending _samples<K>, at TEMP; iterate.py: "
                                "a sampled eval of every model beside the greedy one, at EVAL_SAMPLE_TEMP)")


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
class RefusalMask:
    """Whether the XTuner export trains the turns the environment refused
    (path_collection.py export, iterate.py's data stage). A path that ends
    well may hold them (an unknown command, a craft without its ingredients:
    the step changed nothing), and the paper trains every turn of a good path;
    a small model that searches its own trees finds good paths full of them
    and learns them (the SmolLM2 run: a third of the trained turns at
    iteration 1, half at iteration 2)."""

    mask_refused: bool = setting(False, env="MASK_REFUSED",
                                 help="1: train no turn the environment refused (TextCraft's 'Could not ...', "
                                 "ScienceWorld's 'No known action ...'), kept as history with its loss off; "
                                 "iterate.py: in the data stages still to run (default 0, the paper's: every turn "
                                 "of a good path is trained)")


@dataclass
class CleanPaths:
    """Whether the XTuner export replays each good path and each revision
    sample's continuation on the env server and cuts it to the steps the goal
    needs (agent_r/clean.py): no refused step, no step the goal is reached
    without; the bad prefix and the revision turn stay as they are."""

    clean_paths: bool = setting(False, env="CLEAN_PATHS",
                                help="1: cut every trained continuation to the steps its goal needs, checked by "
                                "replaying it on the env server (rows whose replay misses the goal are left out, "
                                "and counted); iterate.py: in the data stages still to run (default 0, the paper's: "
                                "the searched paths as they are)")


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
