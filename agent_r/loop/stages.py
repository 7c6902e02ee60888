"""The loop's stages and their done-markers: search, data, eval (training is
agent_r/loop/train.py). Each stage is the library call behind one script,
given that script's settings built here from the loop's nested knob groups.

Why done-markers: every stage's library call already resumes item by item
(trees, per-tree revision parts, eval episodes, XTuner checkpoints); a
``.done.json`` written atomically after a stage's outputs records its
statistics, so a rerun skips finished stages without reading their outputs and
the results table is rebuilt from the markers alone. A stage with an item that
failed for good raises ``StageIncomplete`` and gets no marker, so a rerun
retries it.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from agent_r import evaluation, export, revision_data, search
from agent_r.envs import get_env
from agent_r.io import atomic_write_json, read_json
from agent_r.knobs import group_values
from agent_r.llm import weights_sha256
from agent_r.loop import shards
from agent_r.loop.models import ModelPool, Policy
from agent_r.loop.revise_task import revise_tasks_file, write_revise_tasks
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stats import episode_stats
from agent_r.tree import leaf_paths, load_tree

log = logging.getLogger(__name__)

MARKER = ".done.json"


class StageIncomplete(Exception):
    """Some item of a stage failed for good in this run; a rerun retries it."""


def finished(folder: Path, name: str) -> Optional[dict]:
    """The statistics of stage ``name`` in ``folder`` when its done-marker says it finished, else None."""
    try:
        done = read_json(folder / MARKER)
        return done["stats"] if isinstance(done, dict) and done.get("stage") == name else None
    except (ValueError, OSError, KeyError):
        return None


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


# --------------------------------------------------------------------------- one shard process per GPU group

def fan_out(s: IterateSettings, pool: ModelPool, kind: str, settings: Any, folder: Path, what: str) -> None:
    """Where the loop sees more than one GPU group (GPUS), ``settings``' call
    runs first as one shard process per group; the caller then makes the
    same call in process, which finds every item done and loads no model.
    A served model (openai) is one endpoint: nothing to spread."""
    if (s.backend.backend or "").strip() == "openai":
        return
    groups = shards.gpu_groups(shards.gpu_list(s.gpus), s.backend.tensor_parallel_size)
    if len(groups) < 2:
        return
    pool.close()   # the loop's own process holds no GPU while its shards run
    try:
        shards.fan_out(kind, settings, groups, folder, what, pool.seed, pool.max_model_len, run_root(s))
    except shards.ShardFailed as exc:
        raise StageIncomplete(str(exc)) from None


# --------------------------------------------------------------------------- each stage's script settings

def search_settings(s: IterateSettings, task: str, out: Path, p: Policy) -> search.SearchSettings:
    ss = search.SearchSettings(
        **group_values(s.search), task=task, max_token_length=s.max_token_length, max_new_tokens=s.max_new_tokens,
        seed=s.seed, env_server_base=s.servers[task], min=s.min, max=s.max, task_iteration=s.task_iteration,
        split_file=s.search_split.get(task, s.split_file), output_dir=str(out), concurrency=s.concurrency,
        backend=p.backend)
    ss.finish()
    return ss


def path_settings(s: IterateSettings, task: str, trees: Path, out: Path, data_type: str, revise: bool,
                  p: Policy, iteration: int = 1) -> revision_data.PathSettings:
    """path_collection.py's settings for iteration ``iteration``: its ALPHA."""
    pairs = {**group_values(s.pairs), "alpha": s.alpha_for(task, iteration)}
    ps = revision_data.PathSettings(
        **pairs, task=task, input_dir=str(trees), output_dir=str(out), data_type=data_type,
        revise=revise, seed=s.seed, max_new_tokens=s.max_new_tokens, max_token_length=s.max_token_length,
        backend=p.backend)
    ps.finish()
    return ps


def eval_settings(s: IterateSettings, task: str, out: Path, p: Policy, revise_from: Optional[Path] = None,
                  samples: int = 1) -> evaluation.EvalSettings:
    """eval.py's settings of one eval: greedy (EVAL_TEMP) with one episode a
    task, or ``samples`` episodes a task at EVAL_SAMPLE_TEMP."""
    es = evaluation.EvalSettings(
        task=task, model_type="test", eval_samples=samples, max_token_length=s.max_token_length,
        temperature=s.eval_sample_temperature if samples > 1 else s.eval_temperature,
        env_server_base=s.servers[task], max_steps=s.revise_max_steps if revise_from else s.eval_max_steps,
        output_dir=str(out),
        concurrency=s.concurrency, seed=s.seed, max_new_tokens=s.max_new_tokens,
        limit=None if revise_from else s.eval_limit, revise_from=str(revise_from) if revise_from else None,
        wait_reply=s.wait_reply, backend=p.backend)
    es.finish()
    return es


# --------------------------------------------------------------------------- search

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
        fan_out(s, pool, shards.SEARCH, ss, out, f"search-{task}")
        summary = search.collect_trees(ss, backend=pool.backend(p))
        if summary.failed:
            raise StageIncomplete(f"search of {task}: {len(summary.failed)} tree(s) failed "
                                  f"({sorted(summary.failed)[:10]})")
        stats[task] = tree_stats(ss.out_dir(), task)
    return stats


# --------------------------------------------------------------------------- revision and good data

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


def collect_data(s: IterateSettings, pool: ModelPool, trees: Path, out: Path, variant: str, p: Policy,
                 iteration: int = 1) -> tuple[dict, list[str]]:
    """Revision rows (unless ``good``) and good rows of every task: (per-task
    statistics, the JSONL files)."""
    stats, files = {}, []
    for task in s.tasks:
        input_dir = search_settings(s, task, trees, p).out_dir()
        kinds = [("good", False)] if variant == "good" else [("centric", variant == "agent-r"), ("good", False)]
        task_stats: dict[str, Any] = {}
        for data_type, revise in kinds:
            ps = path_settings(s, task, input_dir, out, data_type, revise, p, iteration)
            if ps.revision_config().needs_verifier:
                fan_out(s, pool, shards.DATA, ps, out, f"verifier-{task}-{data_type}")
            verifier = pool.backend(p) if ps.revision_config().needs_verifier else None
            result = revision_data.collect(ps, backend=verifier)
            if result.failed:
                raise StageIncomplete(result.problem)
            got = revision_stats(result)
            task_stats.update(got if data_type == "centric" else {"good_samples": got["good_samples"]})
            files.append(str(result.output))
        task_stats.setdefault("revision_samples", 0)
        stats[task] = task_stats
    return stats, files


def data_stage(s: IterateSettings, pool: ModelPool, trees: Path, out: Path, variant: str, p: Policy,
               train_file: Path, iteration: int = 1) -> dict:
    """The variant's rows of every task, exported as one pooled XTuner file."""
    stats, files = collect_data(s, pool, trees, out, variant, p, iteration)
    return {"tasks": stats, "train_samples": export_rows(s, files, train_file, p.model_dir), **recipe_marks(s, train_file)}


def recipe_marks(s: IterateSettings, train_file: Path) -> dict:
    """What a data marker says of the export's recipe where it is not the
    paper's: MASK_REFUSED, and CLEAN_PATHS with what cleaning did."""
    marks: dict[str, Any] = {"mask_refused": True} if s.mask_refused else {}
    report = export.clean_report_file(train_file)
    if s.clean_paths:
        marks.update(clean_paths=True, **({"clean": read_json(report)} if report.exists() else {}))
    return marks


def replay_servers(s: IterateSettings) -> str:
    """The export's --env_server_base for CLEAN_PATHS: each task's server, as task=url pairs."""
    s.finish()
    return ",".join(f"{t}={s.servers[t]}" for t in s.tasks)


def export_rows(s: IterateSettings, files: list[str], train_file: Path, model_dir: str) -> int:
    """The rows of ``files`` exported as one XTuner file; returns its sample count (0: no file)."""
    # counted with the trained model's tokenizer, so no sample is cut at MAX_LENGTH in training
    tokenizer = model_dir if Path(model_dir).is_dir() else None
    settings = export.ExportSettings(format="xtuner", input=files, output=str(train_file), good_ratio=s.good_ratio,
                                     seed=s.seed, tokenizer=tokenizer, max_length=s.train.max_length,
                                     mask_refused=s.mask_refused, clean_paths=s.clean_paths,
                                     env_server_base=replay_servers(s) if s.clean_paths else None)
    rows = sum(1 for f in files for line in Path(f).read_text(encoding="utf-8").splitlines() if line.strip())
    if not rows:
        return 0
    for line in export.write_export(settings).splitlines():
        log.info(line)
    return len(read_json(train_file))


# --------------------------------------------------------------------------- evaluation

def run_root(s: IterateSettings) -> Path:
    """The run's folder, which its files' paths are written relative to."""
    return Path(s.runs_dir) / s.name


def evaluate_one(s: IterateSettings, es: evaluation.EvalSettings, pool: ModelPool, p: Policy) -> dict:
    """One eval run (resumed per task); the model loads only if tasks remain.
    An episode that failed for good leaves the stage unfinished."""
    fan_out(s, pool, shards.EVAL, es, Path(es.output_dir), f"eval-{es.run_dir().name}")
    planned = evaluation.plan(es)
    done = evaluation.evaluate(es, pool.backend(p) if planned.todo else None, planned=planned, root=run_root(s))
    if done.failed:
        raise StageIncomplete(f"eval of {es.task} in {done.run_dir}: {done.failed} episode(s) failed on env errors")
    sm = done.summary
    return {"tasks": sm["tasks"], "dtype": (sm.get("backend") or {}).get("dtype"), "score_x100": round(sm["score_x100"], 4),
            "success_pct": round(100 * sm["success_rate"], 4), "mean_steps": round(sm["mean_steps"], 4),
            "loops_pct": {k: round(100 * v["fraction"], 2) for k, v in sm["loops"].items()},
            "provenance": sm["provenance"],
            **episode_stats(done.run_dir, [t.key for t in planned.tasks], es.task or "")}


def sampled_eval_stage(s: IterateSettings, pool: ModelPool, out: Path, p: Policy) -> dict:
    """model ``p`` on every task's test split, EVAL_SAMPLES episodes a task:
    Pass@k beside the greedy eval's success (the test split only)."""
    stats: dict[str, Any] = {"samples": s.eval_samples, "temperature": s.eval_sample_temperature, "test": {}}
    for task in s.tasks:
        es = eval_settings(s, task, out, p, samples=s.eval_samples)
        fan_out(s, pool, shards.EVAL, es, out, f"sampled-eval-{task}")
        planned = evaluation.plan(es)
        done = evaluation.evaluate(es, pool.backend(p) if planned.todo else None, planned=planned, root=run_root(s))
        if done.failed:
            raise StageIncomplete(f"sampled eval of {task} in {done.run_dir}: {done.failed} episode(s) failed on "
                                  "env errors")
        sm = done.summary
        stats["test"][task] = {"tasks": sm["tasks"], "episodes": sm["episodes"],
                               "success_pct": round(100 * sm["success_rate"], 4), "pass_at_k": sm["pass_at_k"],
                               "per_task": sm["per_task"], "revision_turns": sm["revision_turns"],
                               "refused_actions": sm["refused_actions"], "provenance": sm["provenance"]}
    return stats


def eval_stage(s: IterateSettings, pool: ModelPool, out: Path, p: Policy, revise_from: Optional[Path]) -> dict:
    """model ``p`` on every task's test split, then on the revision task.
    ``revise_from`` is the folder of the revise-task files (None: the base
    run, which writes them from its own failures). The statistics record
    WAIT_REPLY, so a rerun can tell which setting a finished eval used."""
    stats: dict[str, Any] = {"wait_reply": s.wait_reply, "model_sha256": weights_sha256(p.model_dir), "test": {},
                             "revise_task": {}}
    for task in s.tasks:
        es = eval_settings(s, task, out, p)
        stats["test"][task] = evaluate_one(s, es, pool, p)
        if s.revise_limit == 0:
            continue
        source = revise_tasks_file(revise_from or out, task)
        if revise_from is None:   # the base run: rows depend only on its finished episodes and the seed
            counts = write_revise_tasks(es.run_dir(), source, task, s.seed, s.revise_limit)
            stats.setdefault("revise_task_source", {})[task] = counts
            log.info("revision task of %s: %d of %d failed test episodes, each cut at a random step", task,
                     counts["episodes"], counts["failed"])
        if source.exists() and source.stat().st_size:
            stats["revise_task"][task] = evaluate_one(s, eval_settings(s, task, out, p, revise_from=source), pool, p)
    return stats
