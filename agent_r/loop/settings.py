"""Every setting of ``iterate.py``: its own, and the knob groups of the stages
it runs, nested whole (declared once in agent_r/knobs.py, the training knobs
in agent_r/training/settings.py), so ITERA, ALPHA or LR mean here exactly what
they mean to mcts_collection.py, path_collection.py and the trainers. ALPHA and
EPOCHS may hold one value per iteration (a comma list, agent_r.settings.Schedule):
``alpha_for`` and ``train_knobs`` give iteration k's."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

from agent_r.envs import get_env
from agent_r.knobs import (DEFAULT_TASK, BackendSettings, CleanPaths, EvalSamples, PairKnobs, PromptBudget, RefusalMask,
                           SearchKnobs, TaskChoice, WaitReply, max_new_tokens_setting)
from agent_r.settings import UsageError, at_iteration, nested, setting
from agent_r.training.settings import EtoKnobs, TrainKnobs, TrlKnobs, check_warmup

VARIANTS = ("agent-r", "direct", "good", "eto")
# ALPHA unset: the paper's 0.5, 0.7, 1.0 in iterations 1, 2, 3 (and later), as
# shares of the task's max score (iteration 1's equals every task's own default).
PAPER_ALPHA = (0.5, 0.7, 1.0)
# A good path's leaf must score ABOVE alpha (the reference's "value(high) > ALPHA");
# an alpha at the max score would then keep nothing, where the paper means "only
# optimal trajectories count": such an alpha is handed on just below the max.
OPTIMAL_ONLY = 1 - 1e-9


@dataclass
class IterateSettings(TaskChoice, PromptBudget, WaitReply, EvalSamples, RefusalMask, CleanPaths):
    """Flag > env var > default. TASK takes several environments,
    comma-separated; MAX_TOKEN_LENGTH unset leaves each stage its own budget
    (search and verifier 4096, eval 7000); WAIT_REPLY reaches every eval (the
    test split and the revision task), and each value (and each EVAL_TAG) has
    its own eval folders and table in the run."""

    name: str = setting("run", help="the run's folder under --runs_dir; a rerun with the same name resumes "
                        "(default run)")
    runs_dir: str = setting("runs", help="the root of all runs (default runs)")
    variants: str = setting("agent-r", env="VARIANTS", help="comma-separated: agent-r (the model finds the first "
                            "bad step), direct (revise off), good (good paths only), eto (DPO on success/failure "
                            "pairs of the same trees, agent_r/loop/trl_stages.py) (default agent-r)")
    iterations: int = setting(3, env="ITERATIONS", minimum=0, help="self-training iterations after the base "
                              "model's evaluation (default 3, the paper's)")
    variant_iterations: str = setting("", env="VARIANT_ITERATIONS", help="comma-separated variant=N: stop that "
                                      "variant after iteration N, e.g. good=1,eto=1 for the baselines in "
                                      "iteration 1 only (default: every variant runs ITERATIONS)")
    stop_after: str = setting("", env="STOP_AFTER", choices=("", "data"), help="data: the last iteration "
                              "stops after its data stage, and no model is evaluated (the base model "
                              "included): search and build data on this machine, fine-tune and evaluate on "
                              "another, e.g. one part of the tasks per machine (reproduction/pieces.py merges the parts) "
                              "(default: every stage)")
    train_from: str = setting("previous", env="TRAIN_FROM", choices=("previous", "base"),
                              help="previous: model_k = model_{k-1} fine-tuned on iteration k's data; base: the "
                              "base model fine-tuned on iterations 1..k pooled (default previous)")
    # which train tasks are searched (mcts_collection.py's flags)
    min: int = setting(0, help="lowest train task index (position for sciworld) searched (default 0)")
    max: Optional[int] = setting(None, help="train task indices (positions for sciworld) < MAX (default all)")
    task_iteration: int = setting(5, minimum=1, help="sciworld: variations per task number (default 5)")
    split_file: Optional[str] = setting(None, help="a task list to search instead of the train list "
                                        "(mcts_collection.py --split_file; test tasks in it are still never "
                                        "searched); one TASK only (default none)")
    # the export (path_collection.py export's flag)
    good_ratio: float = setting(1.0, help="good samples per revision sample in the export, -1 = all (default 1)")
    # which trainer
    trainer: str = setting("auto", env="TRAINER", choices=("auto", "xtuner", "cpu", "trl"),
                           help="xtuner (xtuner_config/train.sh in TRAIN_VENV), cpu (agent_r/training/cpu.py, "
                           "tiny models), trl (agent_r/training/trl_sft.py, in this process), auto = xtuner when "
                           "CUDA is available, else cpu (default auto); the eto variant always trains with TRL's "
                           "DPO")
    lora_rank: int = setting(0, env="LORA_RANK", minimum=0,
                             help="LoRA rank of every fine-tune of the run (TRAINER=cpu; alpha 2 x rank, every "
                             "projection): model_k is model_{k-1} with its adapter merged, and the adapter (a few "
                             "MB, iter_<k>/model/<variant>/adapter) rebuilds it in seconds where the weights are "
                             "gone; 0 = full fine-tunes (default, the paper's)")
    train_device: str = setting("cpu", env="TRAIN_DEVICE", choices=("cpu", "cuda"),
                                help="TRAINER=cpu: where its fine-tunes run; cuda trains the same recipe on a GPU "
                                "(bf16 autocast, fp32 master weights; a LoRA run's fine-tunes take minutes there "
                                "instead of hours), the model saved and merged on the CPU (default cpu)")
    checkpoint_minutes: float = setting(10.0, env="CHECKPOINT_MINUTES", minimum=0.0,
                                        help="TRAINER=cpu: minutes between step checkpoints of a fine-tune "
                                        "(iter_<k>/model/<variant>/checkpoint; a rerun goes on from it, and a "
                                        "LoRA run's is banked with the run), 0 = after every step (default 10)")
    train_venv: str = setting(".venv-train", env="TRAIN_VENV", flag=None, help="the XTuner environment "
                              "(default .venv-train)")
    xtuner_config: Optional[str] = setting(None, env="CONFIG", flag=None, help="XTuner config (default "
                                           "xtuner_config/agent_r_llama3_8b_full.py)")
    deepspeed: str = setting("deepspeed_zero2", env="DEEPSPEED", flag=None, help="XTuner DeepSpeed name or JSON "
                             "path, none = off (default deepspeed_zero2)")
    # evaluation (eval.py's names where it has them)
    eval_temperature: float = setting(0.0, env="EVAL_TEMP", minimum=0.0, help="evaluation temperature "
                                      "(default 0, greedy)")
    eval_sample_temperature: float = setting(1.0, env="EVAL_SAMPLE_TEMP", minimum=0.0, help="the sampled eval's "
                                             "temperature (default 1.0)")
    eval_limit: Optional[int] = setting(None, minimum=1, help="the first N test tasks per task (default all)")
    eval_max_steps: int = setting(100, minimum=1, help="model turns per evaluated episode (default 100)")
    revise_limit: Optional[int] = setting(None, minimum=0, help="revision-task episodes per task: the base "
                                          "model's failed test episodes, each cut at a random step and continued by "
                                          "every model; a number caps them (a seeded sample), 0 = off (default: "
                                          "all, the paper's)")
    revise_max_steps: int = setting(50, minimum=1, help="model turns per revision-task episode after the cut "
                                    "(default 50, the paper's)")
    eval_tag: str = setting("", env="EVAL_TAG", help="a label for evals made under other conditions than the "
                            "run's own (another dtype, machine or backend): they go to iter_<k>/eval_<tag>/ with a "
                            "results_<tag>.* table of their own, searches, data and fine-tunes are shared, and the "
                            "revision task keeps the untagged base eval's rows; letters, digits, - (default none)")
    # every stage
    max_new_tokens: int = max_new_tokens_setting()
    concurrency: int = setting(8, minimum=1, help="trees searched / episodes played at once (default 8)")
    gpus: str = setting("", env="GPUS", help="comma-separated device ids the search, verifier and eval stages "
                        "spread over: one shard process per group of --tensor_parallel_size of them, each on its "
                        "share of the stage's tasks (agent_r/loop/shards.py); ids that are not GPUs (a CPU) do "
                        "nothing but split the work (default: CUDA_VISIBLE_DEVICES, else every GPU torch sees; one "
                        "group runs in the loop's own process)")
    seed: int = setting(0, help="the run seed (default 0)")
    env_server_base: Optional[str] = setting(None, help="env server URL, comma-separated per TASK entry "
                                             "(default: each task's local server)")
    # the stages' knob groups
    search: SearchKnobs = nested(SearchKnobs)
    pairs: PairKnobs = nested(PairKnobs)
    train: TrainKnobs = nested(TrainKnobs)
    trl: TrlKnobs = nested(TrlKnobs)      # the TRL trainers' own knobs
    eto: EtoKnobs = nested(EtoKnobs)      # ETO's DPO knobs
    backend: BackendSettings = nested(BackendSettings)

    def finish(self) -> None:
        """Lists parsed and checked once, so every later error is about the run."""
        self.tasks = [get_env(t.strip()).name for t in (self.task or DEFAULT_TASK).split(",") if t.strip()]
        if not self.tasks:
            raise UsageError("TASK is empty: set it to textcraft, sciworld or webshop (or several, comma-separated)")
        self.task = ",".join(self.tasks)
        listed = [v.strip() for v in self.variants.split(",") if v.strip()]
        bad = [v for v in listed if v not in VARIANTS]
        if bad or not listed:
            raise UsageError(f"VARIANTS={self.variants!r}: unknown variant {bad[0] if bad else '(none)'!r}; "
                             f"choose from {', '.join(VARIANTS)} (comma-separated)")
        # one order whatever the command's: a run's table is rewritten by commands of
        # different VARIANTS (one variant per machine) and its rows must not move
        self.variant_list = [v for v in VARIANTS if v in listed]
        self.last_iteration = {v: self.iterations for v in self.variant_list}
        for item in filter(None, (x.strip() for x in self.variant_iterations.split(","))):
            variant, _, n = (x.strip() for x in item.partition("="))
            if variant not in VARIANTS or not n.isdigit():
                raise UsageError(f"VARIANT_ITERATIONS={self.variant_iterations!r}: {item!r} is not variant=N with a "
                                 f"variant of {', '.join(VARIANTS)}; e.g. good=1,eto=1")
            if variant in self.last_iteration:    # one setting serves runs of fewer VARIANTS too
                self.last_iteration[variant] = min(int(n), self.iterations)
        if self.eval_samples > 1 and self.eval_sample_temperature == 0:
            raise UsageError(f"EVAL_SAMPLES={self.eval_samples} samples episodes, but EVAL_SAMPLE_TEMP=0 is greedy "
                             "and would play the same episode each time: set EVAL_SAMPLE_TEMP > 0 (default 1.0)")
        check_warmup(self.train)   # before any stage: the fine-tunes come hours later
        if not re.fullmatch(r"[A-Za-z0-9-]*", self.eval_tag):
            raise UsageError(f"EVAL_TAG={self.eval_tag!r} names a folder (iter_<k>/eval_<tag>): use letters, digits "
                             "and -, e.g. fp32")
        if self.split_file is not None and len(self.tasks) > 1:
            raise UsageError(f"--split_file lists the tasks of one environment, but TASK={self.task!r} names "
                             f"{len(self.tasks)}: run without it, or one TASK")
        servers = [u.strip() for u in (self.env_server_base or "").split(",") if u.strip()]
        if servers and len(servers) != len(self.tasks):
            raise UsageError(f"--env_server_base has {len(servers)} URLs for {len(self.tasks)} tasks: give one "
                             "per TASK entry, in the same order")
        self.servers = dict(zip(self.tasks, servers or [get_env(t).default_server for t in self.tasks]))
        # per task, the task list the search reads instead of --split_file (the loop
        # fills it when it drops the base model's own training tasks)
        self.search_split: dict[str, str] = {}
        self.search_tasks: dict[str, dict] = {}   # what was left out of the search, for results.json

    def variants_at(self, k: int) -> list[str]:
        """The variants that run iteration ``k`` (VARIANT_ITERATIONS)."""
        return [v for v in self.variant_list if k <= self.last_iteration[v]]

    def alpha_for(self, task: str, k: int) -> float:
        """ALPHA of iteration ``k`` for ``task``: the k-th of a comma list, the
        one value given, else the paper's schedule on the task's score scale;
        one at or above the max score keeps only max-score leaves."""
        spec = get_env(task)
        if self.pairs.alpha is None:
            alpha = PAPER_ALPHA[min(k, len(PAPER_ALPHA)) - 1] * spec.max_score
        else:
            alpha = float(at_iteration(self.pairs.alpha, k))
        return spec.max_score * OPTIMAL_ONLY if alpha >= spec.max_score else alpha

    def epochs_for(self, k: int) -> int:
        """EPOCHS of the fine-tune that makes model_k. TRAIN_FROM=base fine-tunes
        the base model every time, as iteration 1 does, so it takes the first."""
        return int(at_iteration(self.train.epochs, 1 if self.train_from == "base" else k))

    def train_knobs(self, k: int) -> TrainKnobs:
        """The training knobs of iteration ``k``: plain numbers, this iteration's."""
        return dataclasses.replace(self.train, epochs=self.epochs_for(k))
