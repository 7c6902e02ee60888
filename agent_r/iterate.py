"""Agent-R's self-training loop behind ``iterate.py`` (docs/iterate.md).

For k = 1..ITERATIONS and each variant, with policy model_{k-1}
(model_0 = MODEL_DIR): search the train split, build revision data
(``agent-r``: the policy finds the first bad step; ``direct``: the whole bad
path is the prefix; ``good``: good paths only) and good data, export one XTuner
file (all tasks pooled), fine-tune, and evaluate model_k on every task's test
split and on the revision task. Iteration 0 is the base model's evaluation.

Why stages with done-markers: every stage is a library call that already
resumes item by item (trees, per-tree revision parts, eval episodes, XTuner
checkpoints); a ``.done.json`` written atomically after a stage's outputs
records its statistics, so a rerun skips finished stages without reading
their outputs and the results table is rebuilt from the markers alone. A
killed run loses at most the items in flight.

Which model iteration k starts from: model_{k-1}, fine-tuned on the data its
own search produced (``TRAIN_FROM=previous``, the default): each iteration
trains only on new data and the policy that made the data is the one that
learns from it. ``TRAIN_FROM=base`` instead fine-tunes the base model on the
data of iterations 1..k pooled, which cannot drift further from the base than
one training run but costs k times the training.

Layout under ``runs/<name>/``: ``iter_<k>/trees/<policy>/`` (``base`` for
k = 1, shared by the variants, else the variant), ``iter_<k>/data/<variant>/``,
``iter_<k>/model/<variant>/hf``, ``iter_<k>/eval/<variant>/``, and
``results.json``, ``results.md``, ``results.png``, rewritten atomically after
every iteration of every variant.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from tqdm import tqdm

from agent_r import cpu_trainer, evaluation, export, plots, report, revision_data, search
from agent_r.envs import get_env, identify_server
from agent_r.io import atomic_write_json, atomic_write_jsonl, atomic_write_text, read_json
from agent_r.llm import Backend, make_backend, resolve_model_dir
from agent_r.settings import (EXIT_ITEMS_FAILED, EXIT_OK, BackendSettings, UsageError, manifest_config,
                              max_new_tokens_setting, nested, setting)
from agent_r.tree import leaf_paths, load_tree
from xtuner_config.settings import TrainSettings

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("agent-r", "direct", "good")
MARKER = ".done.json"
BASE = "base"
# Training defaults are the XTuner config's (one source for both trainers).
TRAIN = {f.name: f.default for f in dataclasses.fields(TrainSettings)}
EVAL_PROMPT_BUDGET = 7000   # eval.py's MAX_TOKEN_LENGTH default, the largest of the stages'


@dataclass
class IterateSettings:
    """Every setting of iterate.py (flag > env var > default)."""

    name: str = setting("run", help="the run's folder under --runs_dir; a rerun with the same name resumes "
                        "(default run)")
    runs_dir: str = setting("runs", help="the root of all runs (default runs)")
    task: str = setting("textcraft", env="TASK", flag=None, help="the environment, or several comma-separated "
                        "(textcraft,sciworld): data pooled, one model, evaluated on each (default textcraft)")
    variants: str = setting("agent-r", env="VARIANTS", help="comma-separated: agent-r (the model finds the first "
                            "bad step), direct (revise off), good (good paths only) (default agent-r)")
    iterations: int = setting(3, env="ITERATIONS", minimum=0, help="self-training iterations after the base "
                              "model's evaluation (default 3, the paper's)")
    train_from: str = setting("previous", env="TRAIN_FROM", choices=("previous", "base"),
                              help="previous: model_k = model_{k-1} fine-tuned on iteration k's data; base: the "
                              "base model fine-tuned on iterations 1..k pooled (default previous)")
    # search (mcts_collection.py's names)
    itera: int = setting(8, env="ITERA", flag=None, minimum=1, help="MCTS iterations per tree (default 8)")
    n_gen: int = setting(4, env="N_GEN", flag=None, minimum=1, help="samples per expansion (default 4)")
    temperature: float = setting(1.0, env="TEMP", flag=None, minimum=0.0, help="search sampling temperature "
                                 "(default 1.0)")
    max_depth: Optional[int] = setting(None, env="MAX_DEPTH", flag=None, minimum=0,
                                       help="search depth limit (default per task)")
    min: int = setting(0, help="lowest train task index (position for sciworld) searched (default 0)")
    max: Optional[int] = setting(None, help="train task indices (positions for sciworld) < MAX (default all)")
    task_iteration: int = setting(5, minimum=1, help="sciworld: variations per task number (default 5)")
    split_file: Optional[str] = setting(None, help="a task list to search instead of the train list "
                                        "(mcts_collection.py --split_file; test tasks in it are still never "
                                        "searched); one TASK only (default none)")
    # revision data and export (path_collection.py's names)
    alpha: Optional[float] = setting(None, env="ALPHA", flag=None, help="good-path threshold (default per task)")
    beta: Optional[float] = setting(None, env="BETA", flag=None, minimum=0.0,
                                    help="pair score gap (default per task)")
    max_pairs_per_tree: int = setting(0, minimum=0, help="revision pairs kept per tree, 0 = all (default 0)")
    good_ratio: float = setting(1.0, help="good samples per revision sample in the export, -1 = all (default 1)")
    general_data: str = setting(TRAIN["general_data"], env="GENERAL_DATA", flag=None,
                                help="ShareGPT-style general data mixed into training (default none)")
    eta: float = setting(TRAIN["eta"], env="ETA", flag=None, minimum=0.0,
                         help=f"general samples per agent sample (default {TRAIN['eta']})")
    # training (the XTuner config's names and defaults)
    trainer: str = setting("auto", env="TRAINER", choices=("auto", "xtuner", "cpu"),
                           help="xtuner (xtuner_config/train.sh in TRAIN_VENV), cpu (agent_r/cpu_trainer.py, "
                           "tiny models), auto = xtuner when CUDA is available, else cpu (default auto)")
    train_venv: str = setting(".venv-train", env="TRAIN_VENV", flag=None, help="the XTuner environment "
                              "(default .venv-train)")
    xtuner_config: Optional[str] = setting(None, env="CONFIG", flag=None, help="XTuner config (default "
                                           "xtuner_config/agent_r_llama3_8b_full.py)")
    deepspeed: str = setting("deepspeed_zero2", env="DEEPSPEED", flag=None, help="XTuner DeepSpeed name or JSON "
                             "path, none = off (default deepspeed_zero2)")
    lr: float = setting(TRAIN["lr"], env="LR", flag=None, minimum=0.0,
                        help=f"peak learning rate (default {TRAIN['lr']})")
    epochs: int = setting(TRAIN["epochs"], env="EPOCHS", flag=None, minimum=1,
                          help=f"training epochs (default {TRAIN['epochs']})")
    max_length: int = setting(TRAIN["max_length"], env="MAX_LENGTH", flag=None, minimum=16,
                              help=f"tokens per training sequence (default {TRAIN['max_length']})")
    batch_size: int = setting(TRAIN["batch_size"], env="BATCH_SIZE", flag=None, minimum=1,
                              help=f"sequences per step (default {TRAIN['batch_size']})")
    accumulative_counts: int = setting(TRAIN["accumulative_counts"], env="ACCUMULATIVE_COUNTS", flag=None,
                                       minimum=1, help=f"gradient accumulation (default "
                                       f"{TRAIN['accumulative_counts']})")
    warmup_ratio: float = setting(TRAIN["warmup_ratio"], env="WARMUP_RATIO", flag=None, minimum=0.0,
                                  help=f"warm-up fraction (default {TRAIN['warmup_ratio']})")
    # evaluation (eval.py's names)
    eval_temperature: float = setting(0.0, env="EVAL_TEMP", minimum=0.0, help="evaluation temperature "
                                      "(default 0, greedy)")
    eval_limit: Optional[int] = setting(None, minimum=1, help="the first N test tasks per task (default all)")
    eval_max_steps: int = setting(100, minimum=1, help="model turns per evaluated episode (default 100)")
    revise_limit: int = setting(20, minimum=0, help="revision-task episodes per task: the base model's first N "
                                "failed test episodes, continued by each model (0 = off; default 20)")
    # shared
    max_new_tokens: int = max_new_tokens_setting()
    max_token_length: Optional[int] = setting(None, env="MAX_TOKEN_LENGTH", flag=None, minimum=100,
                                              help="prompt budget (default: each stage's own, 4096 / eval 7000)")
    concurrency: int = setting(8, minimum=1, help="trees searched / episodes played at once (default 8)")
    seed: int = setting(0, help="the run seed (default 0)")
    env_server_base: Optional[str] = setting(None, help="env server URL, comma-separated per TASK entry "
                                             "(default: each task's local server)")
    backend: BackendSettings = nested(BackendSettings)

    def finish(self) -> None:
        """Lists parsed and checked once, so every later error is about the run."""
        self.tasks = [get_env(t.strip()).name for t in self.task.split(",") if t.strip()]
        if not self.tasks:
            raise UsageError("TASK is empty: set it to textcraft, sciworld or webshop (or several, comma-separated)")
        self.variant_list = [v.strip() for v in self.variants.split(",") if v.strip()]
        bad = [v for v in self.variant_list if v not in VARIANTS]
        if bad or not self.variant_list:
            raise UsageError(f"VARIANTS={self.variants!r}: unknown variant {bad[0] if bad else '(none)'!r}; "
                             f"choose from {', '.join(VARIANTS)} (comma-separated)")
        if self.split_file is not None and len(self.tasks) > 1:
            raise UsageError(f"--split_file lists the tasks of one environment, but TASK={self.task!r} names "
                             f"{len(self.tasks)}: run without it, or one TASK")
        servers = [u.strip() for u in (self.env_server_base or "").split(",") if u.strip()]
        if servers and len(servers) != len(self.tasks):
            raise UsageError(f"--env_server_base has {len(servers)} URLs for {len(self.tasks)} tasks: give one "
                             "per TASK entry, in the same order")
        self.servers = dict(zip(self.tasks, servers or [get_env(t).default_server for t in self.tasks]))


# --------------------------------------------------------------------------- where things go

class Layout:
    """Paths of one run (module docstring)."""

    def __init__(self, root: Path):
        self.root = root

    def iteration(self, k: int) -> Path:
        return self.root / f"iter_{k}"

    def trees(self, k: int, policy: str) -> Path:
        return self.iteration(k) / "trees" / policy

    def data(self, k: int, variant: str) -> Path:
        return self.iteration(k) / "data" / variant

    def model(self, k: int, variant: str) -> Path:
        return self.iteration(k) / "model" / variant

    def eval(self, k: int, variant: str) -> Path:
        return self.iteration(k) / "eval" / variant

    def shown(self, path: str | Path) -> str:
        """A path as results show it: relative to the run when inside it, so
        two runs of the same settings give equal results."""
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)


@dataclass
class Policy:
    """A model of the loop: where it is and how the backend settings name it."""

    label: str                 # base, or <variant>-iter<k>
    model_dir: str
    backend: BackendSettings


def policy(settings: IterateSettings, label: str, model_dir: str) -> Policy:
    """Backend settings for one model: MODEL_DIR replaced and output folders
    named by the label (the openai backend is left as set: it serves one
    model, which only iteration 0 can use)."""
    if (settings.backend.backend or "").strip() == "openai":
        return Policy(label, model_dir, settings.backend)
    return Policy(label, model_dir, dataclasses.replace(settings.backend, model_dir=model_dir, model_name=label))


class ModelPool:
    """One live backend, kept while consecutive stages use the same model
    (search and verifier of model_{k-1}; eval and revision task of model_k),
    closed before training so an accelerator is free for the trainer."""

    def __init__(self, seed: int, max_model_len: int):
        self.seed, self.max_model_len = seed, max_model_len
        self.key: Optional[str] = None
        self.backend: Optional[Backend] = None

    def get(self, p: Policy) -> Backend:
        if self.key != p.model_dir:
            self.close()
            self.backend = make_backend(p.backend, seed=self.seed, max_model_len=self.max_model_len)
            self.key = p.model_dir
        return self.backend

    def lazy(self, p: Policy) -> Any:
        """``p``'s backend, loaded at first use: a stage whose items are all
        done (a resumed run) loads no model."""
        return _LazyBackend(self, p)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
        self.backend, self.key = None, None


class _LazyBackend:
    """Stands in for a pool backend; every attribute access goes to the real one."""

    def __init__(self, pool: ModelPool, p: Policy):
        self._pool, self._policy = pool, p

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool.get(self._policy), name)


class StageIncomplete(Exception):
    """Some item of a stage failed for good in this run; a rerun retries it."""


def run_stage(folder: Path, name: str, work: Callable[[], dict]) -> tuple[dict, float]:
    """(the stage's statistics, its seconds): from its done-marker, or by
    running ``work`` and then writing the marker (atomically, after the
    stage's outputs)."""
    marker = folder / MARKER
    if marker.exists():
        try:
            done = read_json(marker)
            if isinstance(done, dict) and done.get("stage") == name:
                return done["stats"], done["seconds"]
        except (ValueError, KeyError):
            pass
        log.warning("%s: unreadable done-marker, redoing the stage", marker)
    started = time.time()
    stats = work()
    seconds = round(time.time() - started, 1)
    atomic_write_json(marker, {"stage": name, "stats": stats, "seconds": seconds})
    return stats, seconds


# --------------------------------------------------------------------------- settings of each stage

def _given(**values: Any) -> dict:
    """Only the values set, so each stage keeps its own default for the rest."""
    return {k: v for k, v in values.items() if v is not None}


def search_settings(s: IterateSettings, task: str, out: Path, p: Policy) -> search.SearchSettings:
    ss = search.SearchSettings(**_given(
        task=task, max_depth=s.max_depth, iterations=s.itera, n_gen=s.n_gen, temperature=s.temperature,
        max_token_length=s.max_token_length, max_new_tokens=s.max_new_tokens, seed=s.seed,
        env_server_base=s.servers[task], min=s.min, max=s.max, task_iteration=s.task_iteration,
        split_file=s.split_file, output_dir=str(out), concurrency=s.concurrency, backend=p.backend))
    ss.finish()
    return ss


def path_settings(s: IterateSettings, task: str, trees: Path, out: Path, data_type: str, revise: bool,
                  p: Policy) -> revision_data.PathSettings:
    ps = revision_data.PathSettings(**_given(
        task=task, alpha=s.alpha, beta=s.beta, input_dir=str(trees), output_dir=str(out), data_type=data_type,
        revise=revise, seed=s.seed, max_pairs_per_tree=s.max_pairs_per_tree, max_new_tokens=s.max_new_tokens,
        max_token_length=s.max_token_length, backend=p.backend))
    ps.finish()
    return ps


def eval_settings(s: IterateSettings, task: str, out: Path, p: Policy, revise_from: Optional[Path] = None
                  ) -> evaluation.EvalSettings:
    es = evaluation.EvalSettings(**_given(
        task=task, model_type="test", temperature=s.eval_temperature, max_token_length=s.max_token_length,
        env_server_base=s.servers[task], max_steps=s.eval_max_steps, output_dir=str(out),
        concurrency=s.concurrency, seed=s.seed, max_new_tokens=s.max_new_tokens,
        limit=None if revise_from else s.eval_limit, revise_from=str(revise_from) if revise_from else None,
        backend=p.backend))
    es.finish()
    return es


# --------------------------------------------------------------------------- stages

def tree_stats(folder: Path, task: str) -> dict:
    """Counts read from the tree files (the same on a resumed run)."""
    spec = get_env(task)
    out = {"trees": 0, "trees_with_success": 0, "leaves": 0, "successful_leaves": 0}
    for path in sorted(folder.glob("search_results_*.json")):
        wins = [spec.is_success(p[-1].env_score) for p in leaf_paths(load_tree(path))]
        out["trees"] += 1
        out["trees_with_success"] += any(wins)
        out["leaves"] += len(wins)
        out["successful_leaves"] += sum(wins)
    return out


def search_stage(s: IterateSettings, pool: ModelPool, out: Path, p: Policy) -> dict:
    """Trees of every task, searched by ``p``."""
    stats = {}
    for task in s.tasks:
        ss = search_settings(s, task, out, p)
        summary = search.collect_trees(ss, backend=pool.lazy(p))
        if summary.failed:
            raise StageIncomplete(f"search of {task}: {len(summary.failed)} tree(s) failed ({sorted(summary.failed)[:10]})")
        stats[task] = tree_stats(ss.out_dir(), task)
    return stats


def revision_stats(result: revision_data.CollectResult) -> dict:
    """Table 1's counts and Fig. 5's first-bad-step position of one collect run."""
    done = [result.results[i] for i in result.trees if i in result.results]
    hist: dict[str, int] = {}
    for rows in done:
        for pos, n in rows.first_bad.items():
            hist[pos] = hist.get(pos, 0) + n
    found = {int(pos): n for pos, n in hist.items() if pos != "none"}
    mean = sum(pos * n for pos, n in found.items()) / sum(found.values()) if found else None
    return {"pairs": sum(r.pairs for r in done), "revision_samples": sum(r.revision_samples for r in done),
            "good_samples": sum(r.good_samples for r in done), "first_bad": hist,
            "mean_first_bad_step": None if mean is None else round(mean, 3),
            "verifier_prompts": sum(r.verifier_prompts for r in done)}


def collect_data(s: IterateSettings, pool: ModelPool, trees: Path, out: Path, variant: str, p: Policy
                 ) -> tuple[dict, list[str]]:
    """Revision rows (unless ``good``) and good rows of every task: (per-task
    statistics, the JSONL files)."""
    stats, files = {}, []
    for task in s.tasks:
        input_dir = search_settings(s, task, trees, p).out_dir()
        kinds = [("good", False)] if variant == "good" else [("centric", variant == "agent-r"), ("good", False)]
        task_stats: dict[str, Any] = {}
        for data_type, revise in kinds:
            ps = path_settings(s, task, input_dir, out, data_type, revise, p)
            result = revision_data.collect(ps, backend=pool.lazy(p) if ps.revision_config().needs_verifier else None)
            if result.failed:
                raise StageIncomplete(result.problem)
            got = revision_stats(result)
            task_stats.update(got if data_type == "centric" else {"good_samples": got["good_samples"]})
            files.append(str(result.output))
        task_stats.setdefault("revision_samples", 0)
        stats[task] = task_stats
    return stats, files


def data_stage(s: IterateSettings, pool: ModelPool, trees: Path, out: Path, variant: str, p: Policy) -> dict:
    """The variant's rows of every task, exported as one pooled XTuner file."""
    stats, files = collect_data(s, pool, trees, out, variant, p)
    train = out / "train.json"
    # counted with the trained model's tokenizer, so no sample is cut at MAX_LENGTH in training
    tokenizer = p.model_dir if Path(p.model_dir).is_dir() else None
    settings = export.ExportSettings(format="xtuner", input=files, output=str(train), good_ratio=s.good_ratio,
                                     seed=s.seed, tokenizer=tokenizer, max_length=s.max_length)
    rows = sum(1 for f in files for line in Path(f).read_text(encoding="utf-8").splitlines() if line.strip())
    if rows:
        for line in export.write_export(settings).splitlines():
            log.info(line)
    samples = len(read_json(train)) if rows else 0
    return {"tasks": stats, "train_samples": samples}


# --------------------------------------------------------------------------- training

class TrainingFailed(Exception):
    """The trainer exited with an error; its log says why."""

    user_facing = True


def resolve_trainer(s: IterateSettings) -> str:
    """auto -> xtuner where CUDA is available (a cluster), else cpu."""
    if s.trainer != "auto":
        return s.trainer
    import torch

    return "xtuner" if torch.cuda.is_available() else "cpu"


def check_trainer(s: IterateSettings) -> str:
    """The trainer to use; a missing XTuner environment is a usage error now,
    not after the first search."""
    trainer = resolve_trainer(s)
    if trainer == "xtuner" and not (Path(s.train_venv) / "bin" / "python").exists():
        raise UsageError(f"the training environment {s.train_venv} is missing (TRAINER=xtuner): run `make "
                         "setup-train` (or set TRAIN_VENV to your XTuner environment), or TRAINER=cpu for tiny "
                         "models on CPU")
    return trainer


def train_config(s: IterateSettings) -> cpu_trainer.TrainConfig:
    return cpu_trainer.TrainConfig(lr=s.lr, epochs=s.epochs, max_length=s.max_length, batch_size=s.batch_size,
                                   accumulative_counts=s.accumulative_counts, warmup_ratio=s.warmup_ratio,
                                   seed=s.seed, general_data=s.general_data, eta=s.eta)


def xtuner_losses(work_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for scalars in sorted(work_dir.glob("*/vis_data/scalars.json"))
            for line in scalars.read_text(encoding="utf-8").splitlines() if '"loss"' in line]


def train_xtuner(s: IterateSettings, start: str, data_files: list[str], out: Path) -> dict:
    """xtuner_config/train.sh in the training environment (the environment is
    inherited: NPROC_PER_NODE, NNODES, SAVE_FP32, PYTHONPATH ... reach it);
    writes ``out/xtuner`` (checkpoints, resumed on a rerun) and ``out/hf``."""
    c = train_config(s)
    values = _given(MODEL_DIR=start, DATA_FILES=",".join(data_files), GENERAL_DATA=s.general_data, ETA=s.eta,
                    SEED=s.seed, MAX_LENGTH=s.max_length, BATCH_SIZE=c.batch_size,
                    ACCUMULATIVE_COUNTS=c.accumulative_counts, EPOCHS=c.epochs, LR=c.lr,
                    WARMUP_RATIO=c.warmup_ratio, WORK_DIR=out / "xtuner", HF_DIR=out / "hf",
                    CONFIG=s.xtuner_config, DEEPSPEED=s.deepspeed, TRAIN_VENV=Path(s.train_venv).resolve())
    # The venv's bin goes first on PATH (xtuner runs a bare `python`); set in the
    # child's shell so this process never reads or copies its own environment.
    command = ["env", *[f"{k}={v}" for k, v in values.items()], "bash", "-c",
               'export PATH="$TRAIN_VENV/bin:$PATH"; unset VIRTUAL_ENV; exec bash "$0"',
               str(REPO / "xtuner_config" / "train.sh")]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "a", encoding="utf-8") as logfile:
        code = subprocess.run(command, cwd=REPO, stdout=logfile, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise TrainingFailed(f"xtuner_config/train.sh failed (exit {code}); see {out / 'train.log'}")
    losses = xtuner_losses(out / "xtuner")   # logged every LoggerHook interval
    last = Path((out / "xtuner" / "last_checkpoint").read_text(encoding="utf-8").strip()).name
    tenth = max(1, len(losses) // 10)
    return {"trainer": "xtuner", "steps": int(re.sub(r"\D", "", last) or 0),
            "first_loss": round(sum(losses[:tenth]) / tenth, 4) if losses else None,
            "last_loss": round(sum(losses[-tenth:]) / tenth, 4) if losses else None}


def train_stage(s: IterateSettings, pool: ModelPool, trainer: str, start: str, data_files: list[str],
                out: Path) -> dict:
    """model_k in ``out/hf``, fine-tuned from ``start`` on ``data_files``."""
    pool.close()   # the accelerator (or the CPU) is the trainer's now
    if trainer == "xtuner":
        stats = train_xtuner(s, start, data_files, out)
    else:
        stats = cpu_trainer.fine_tune(start, data_files, str(out / "hf"), train_config(s))
    stats.pop("config", None)
    stats.pop("seconds", None)   # the stage's time is recorded with every stage's
    return stats


# --------------------------------------------------------------------------- evaluation

def evaluate_one(es: evaluation.EvalSettings, pool: ModelPool, p: Policy) -> dict:
    """One eval run (resumed per task); the model loads only if tasks remain."""
    planned = evaluation.plan(es)
    done = evaluation.evaluate(es, pool.get(p) if planned.todo else None, planned=planned)
    if done.failed:
        raise StageIncomplete(f"eval of {es.task} in {done.run_dir}: {done.failed} episode(s) failed on env errors")
    sm = done.summary
    return {"tasks": sm["tasks"], "score_x100": round(sm["score_x100"], 4),
            "success_pct": round(100 * sm["success_rate"], 4), "mean_steps": round(sm["mean_steps"], 4),
            "loops_pct": {k: round(100 * v["fraction"], 2) for k, v in sm["loops"].items()}}


def revise_tasks_file(folder: Path, task: str) -> Path:
    return folder / f"revise_tasks_{task}.jsonl"


def write_revise_tasks(s: IterateSettings, run_dir: Path, target: Path) -> int:
    """The revision task (paper Table 3): the base model's first REVISE_LIMIT
    failed test episodes that ran out of steps (a disaster would only end again
    on replay), as ``{task_num, messages}`` rows for ``eval.py --revise_from``."""
    rows = []
    for result in sorted(report.load_results(run_dir), key=lambda r: int(r["task_id"])):
        if not result.get("success") and result.get("ended_by") == "step_limit" and len(rows) < s.revise_limit:
            rows.append({"task_num": result["task_id"], "messages": result["state"]})
    atomic_write_jsonl(target, rows)
    return len(rows)


def eval_stage(s: IterateSettings, pool: ModelPool, out: Path, p: Policy, revise_from: Optional[Path]) -> dict:
    """model ``p`` on every task's test split, then on the revision task.
    ``revise_from`` is the folder of the revise-task files (None: the base
    run, which writes them from its own failures)."""
    stats: dict[str, Any] = {"test": {}, "revise_task": {}}
    for task in s.tasks:
        es = eval_settings(s, task, out, p)
        stats["test"][task] = evaluate_one(es, pool, p)
        if s.revise_limit <= 0:
            continue
        source = revise_tasks_file(revise_from or out, task)
        if revise_from is None and not source.exists():
            write_revise_tasks(s, es.run_dir(), source)
        if source.exists() and source.stat().st_size:
            stats["revise_task"][task] = evaluate_one(eval_settings(s, task, out, p, revise_from=source), pool, p)
    return stats


# --------------------------------------------------------------------------- the loop

@dataclass
class Loop:
    """One run of the loop: its settings, paths, models and finished rows."""

    settings: IterateSettings
    layout: Layout
    pool: ModelPool
    trainer: str
    base: Policy
    rows: list[dict] = field(default_factory=list)
    progress: Any = None
    seconds: dict[str, float] = field(default_factory=dict)   # of the row being built, per stage

    def stage(self, k: int, variant: str, name: str, folder: Path, work: Callable[[], dict]) -> dict:
        self.progress.set_description(f"iteration {k}/{self.settings.iterations} {variant}: {name}")
        log.info("iteration %d, %s: %s -> %s", k, variant, name, folder)
        stats, self.seconds[name] = run_stage(folder, name, work)
        self.progress.update(1)
        return stats

    def finish_row(self, row: dict) -> dict:
        row["seconds"], self.seconds = self.seconds, {}
        self.rows.append(row)
        return row

    def model(self, k: int, variant: str) -> Policy:
        """model_k of a variant (model_0 is the base model); an iteration
        without training data keeps the model it started from."""
        if k == 0:
            return self.base
        hf = self.layout.model(k, variant) / "hf"
        if not hf.exists():
            return self.model(k - 1, variant)
        return policy(self.settings, f"{variant}-iter{k}", str(hf))

    def base_row(self) -> dict:
        s, folder = self.settings, self.layout.eval(0, BASE)
        stats = self.stage(0, BASE, "eval", folder, lambda: eval_stage(s, self.pool, folder, self.base, None))
        return self.finish_row({"iteration": 0, "variant": BASE, "model": self.layout.shown(self.base.model_dir),
                                "started_from": None, **stats})

    def iteration_row(self, k: int, variant: str) -> dict:
        s, lay = self.settings, self.layout
        prev = self.model(k - 1, variant)
        trees = lay.trees(k, BASE if k == 1 else variant)
        searched = self.stage(k, variant, "search", trees, lambda: search_stage(s, self.pool, trees, prev))
        data_dir = lay.data(k, variant)
        data = self.stage(k, variant, "data", data_dir,
                          lambda: data_stage(s, self.pool, trees, data_dir, variant, prev))
        start, files = self.training_plan(k, variant, prev)
        model_dir = lay.model(k, variant)
        trained = self.stage(k, variant, "train", model_dir, lambda: self.train(start, files, model_dir))
        model = self.model(k, variant)
        evals = self.stage(k, variant, "eval", lay.eval(k, variant),
                           lambda: eval_stage(s, self.pool, lay.eval(k, variant), model, lay.eval(0, BASE)))
        return self.finish_row({"iteration": k, "variant": variant, "model": lay.shown(model.model_dir),
                                "started_from": lay.shown(start if files else prev.model_dir), **evals,
                                "search": searched, "data": data, "train": trained})

    def training_plan(self, k: int, variant: str, prev: Policy) -> tuple[str, list[str]]:
        """(the model fine-tuned, the export files it learns from) for model_k."""
        s, lay = self.settings, self.layout
        if s.train_from == "base":
            start, rounds = resolve_model_dir(self.base.model_dir), range(1, k + 1)
        else:
            start, rounds = resolve_model_dir(prev.model_dir), range(k, k + 1)
        files = [str(lay.data(j, variant) / "train.json") for j in rounds
                 if (lay.data(j, variant) / "train.json").exists()]
        return start, files

    def train(self, start: str, files: list[str], out: Path) -> dict:
        if not files:
            log.warning("no training samples: %s keeps the model it started from", out)
            return {"trainer": None, "skipped": "no training samples"}
        return train_stage(self.settings, self.pool, self.trainer, start, files, out)


# --------------------------------------------------------------------------- results files

def average(row: dict, key: str) -> Optional[float]:
    values = [v[key] for v in row.get("test", {}).values()]
    return round(sum(values) / len(values), 4) if values else None


def markdown(s: IterateSettings, rows: list[dict]) -> str:
    """results.md: test success per task and iteration, then the statistics."""
    tasks = s.tasks
    head = ["iteration", "variant", *[f"{t} success %" for t in tasks]] + (["average"] if len(tasks) > 1 else [])
    lines = [f"# Agent-R self-training: {s.name}", "",
             f"Test success % (TEMP={s.eval_temperature:g}, at most {s.eval_max_steps} turns, "
             f"{'all' if s.eval_limit is None else f'the first {s.eval_limit}'} test tasks per task); "
             "iteration 0 is the base model.", "", _md_row(head), _md_row(["---"] * len(head))]
    for r in rows:
        cells = [str(r["iteration"]), r["variant"], *[_fmt(r["test"].get(t, {}).get("success_pct")) for t in tasks]]
        lines.append(_md_row(cells + ([_fmt(average(r, "success_pct"))] if len(tasks) > 1 else [])))
    stat_head = ["iteration", "variant", "revision samples", "good samples", "train samples", "mean first bad step",
                 "loop k=1 % episodes", "revision-task success %", "train loss first -> last"]
    lines += ["", "Per-iteration statistics (summed over tasks; loop and revision task: mean over tasks).", "",
              _md_row(stat_head), _md_row(["---"] * len(stat_head))]
    lines += [_md_row(_stat_cells(r)) for r in rows]
    return "\n".join(lines) + "\n"


def _stat_cells(r: dict) -> list[str]:
    per_task = r.get("data", {}).get("tasks", {}).values()
    firsts = [t["mean_first_bad_step"] for t in per_task if t.get("mean_first_bad_step") is not None]
    loops = [t["loops_pct"]["1"] for t in r.get("test", {}).values()]
    revise = [t["success_pct"] for t in r.get("revise_task", {}).values()]
    train = r.get("train") or {}
    loss = f"{train['first_loss']:.3f} -> {train['last_loss']:.3f}" if train.get("first_loss") is not None else "-"
    mean = lambda xs: _fmt(sum(xs) / len(xs)) if xs else "-"  # noqa: E731
    return [str(r["iteration"]), r["variant"],
            *[str(sum(t.get(k, 0) for t in per_task)) if r["iteration"] else "-"
              for k in ("revision_samples", "good_samples")],
            str(r.get("data", {}).get("train_samples", "-")), mean(firsts), mean(loops), mean(revise), loss]


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"


def write_plot(s: IterateSettings, rows: list[dict], path: Path) -> None:
    """results.png: test success % per iteration, one line per variant (each
    starts at the base model), one panel per task plus the average."""
    value = lambda r, t: average(r, "success_pct") if t == "average" else r["test"][t]["success_pct"]  # noqa: E731
    base = [r for r in rows if r["iteration"] == 0]
    panels = {t: {variant: [(r["iteration"], value(r, t)) for r in base + [r for r in rows if r["variant"] == variant]]
                  for variant in s.variant_list}
              for t in s.tasks + (["average"] if len(s.tasks) > 1 else [])}
    plots.iteration_lines(panels, s.iterations, path)


def write_results(s: IterateSettings, layout: Layout, rows: list[dict], trainer: str) -> None:
    """results.json, results.md and results.png, each replaced atomically."""
    atomic_write_json(layout.root / "results.json", {
        "name": s.name, "tasks": s.tasks, "variants": s.variant_list, "iterations": s.iterations,
        "train_from": s.train_from, "trainer": trainer, "config": manifest_config(s), "rows": rows})
    atomic_write_text(layout.root / "results.md", markdown(s, rows))
    write_plot(s, rows, layout.root / "results.png")


# --------------------------------------------------------------------------- a whole run

@dataclass
class LoopResult:
    """What ``run`` did; the script prints ``table`` and returns ``exit_code``."""

    root: Path
    rows: list[dict]
    table: str
    incomplete: Optional[str] = None

    @property
    def exit_code(self) -> int:
        return EXIT_ITEMS_FAILED if self.incomplete else EXIT_OK


def check_inputs(s: IterateSettings) -> tuple[str, str]:
    """(base model dir, trainer), after every check that can fail in seconds:
    settings, MODEL_DIR, the trainer's environment, the env servers."""
    s.finish()
    openai = (s.backend.backend or "").strip() == "openai"
    if openai and s.iterations > 0:
        raise UsageError("backend openai serves one fixed model, but iterate.py loads each new model_k: use "
                         "--backend vllm or hf (ITERATIONS=0 evaluates a served model)")
    base = s.backend.model_dir or "" if openai else resolve_model_dir(s.backend.model_dir)
    trainer = check_trainer(s) if s.iterations > 0 else "none"
    for task in s.tasks:
        identify_server(s.servers[task], get_env(task))   # reachable, and serving this task
    return base, trainer


def stage_count(s: IterateSettings) -> int:
    return 1 + s.iterations * len(s.variant_list) * 4


def run(s: IterateSettings) -> LoopResult:
    """iterate.py's whole job (module docstring); resumes a run of the same name."""
    base_dir, trainer = check_inputs(s)
    layout = Layout(Path(s.runs_dir) / s.name)
    # one engine serves every stage: sized for the largest prompt budget (eval's 7000 by default)
    pool = ModelPool(s.seed, (s.max_token_length or EVAL_PROMPT_BUDGET) + s.max_new_tokens)
    loop = Loop(s, layout, pool, trainer, policy(s, BASE, base_dir))
    incomplete = None
    try:
        with tqdm(total=stage_count(s), unit="stage") as loop.progress:
            loop.base_row()
            write_results(s, layout, loop.rows, trainer)
            for k in range(1, s.iterations + 1):
                for variant in s.variant_list:
                    loop.iteration_row(k, variant)
                    write_results(s, layout, loop.rows, trainer)
    except StageIncomplete as exc:
        incomplete = f"{exc}; rerun the same command to retry (finished stages are kept)"
    finally:
        loop.pool.close()
    if loop.rows:
        write_results(s, layout, loop.rows, trainer)
    return LoopResult(layout.root, loop.rows, markdown(s, loop.rows), incomplete)
