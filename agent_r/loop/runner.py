"""One run of the loop: the checks that can fail in seconds, then iteration 0
(the base model's eval) and, for k = 1..ITERATIONS and each variant, search,
data, train and eval, each stage resumed or skipped by its done-marker
(agent_r/loop/stages.py); a results row per finished iteration."""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from tqdm import tqdm

from agent_r.envs import get_env, identify_server
from agent_r.io import locked, read_json
from agent_r.knobs import EVAL_PROMPT_BUDGET
from agent_r.llm import resolve_model_dir
from agent_r.loop import stages, trl_stages
from agent_r.paths import BASE, RESULT_PREFIX, Layout
from agent_r.provenance import recorded as recorded_provenance
from agent_r.loop.revise_task import revise_tasks_file
from agent_r.loop.models import ModelPool, Policy, policy
from agent_r.loop.results import markdown, write_results
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stages import MARKER, StageIncomplete, finished, run_stage, search_settings
from agent_r.loop.train import check_trainer, train_stage
from agent_r.settings import EXIT_ITEMS_FAILED, EXIT_OK, UsageError
from agent_r.training.adapter import ADAPTER_RECORD, CHECKSUM, Lora, apply_adapter, lora_record

log = logging.getLogger(__name__)

STAGES_PER_ITERATION = 4   # search, data, train, eval


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
        self.fill_provenance(row)
        self.rows.append(row)
        return row

    def fill_provenance(self, row: dict) -> None:
        """A row rebuilt from done-markers written before evals recorded a
        provenance takes it from each eval's summary (``unknown`` where that
        does not know a field), and names its weights from them."""
        k, variant = row["iteration"], row["variant"]
        for part, revise_from in (("test", None), ("revise_task", Path("revise"))):
            for task, stats in (row.get(part) or {}).items():
                if isinstance(stats, dict) and "provenance" not in stats:
                    es = stages.eval_settings(self.settings, task, self.layout.eval(k, variant), self.model(k, variant),
                                              revise_from=revise_from)
                    stats["provenance"] = recorded_provenance(es.run_dir())
        if not row.get("model_sha256"):
            known = {stats["provenance"]["model_sha256"] for part in ("test", "revise_task")
                     for stats in (row.get(part) or {}).values() if isinstance(stats, dict)} - {"unknown"}
            if len(known) == 1:
                row["model_sha256"] = known.pop()

    def model(self, k: int, variant: str) -> Policy:
        """model_k of a variant (model_0 is the base model); an iteration
        without training data keeps the model it started from."""
        if k == 0:
            return self.base
        hf = self.layout.hf(k, variant)
        if not hf.exists() and not self.trained(k, variant):
            return self.model(k - 1, variant)
        return policy(self.settings.backend, f"{variant}-iter{k}", str(hf))

    def trained(self, k: int, variant: str) -> bool:
        """Whether the train stage of model_k finished with a fine-tune (not skipped for want of data)."""
        stats = finished(self.layout.model(k, variant), "train")
        return bool(stats and stats.get("trainer"))

    def model_needed(self, k: int, variant: str) -> bool:
        """Whether a stage still to run reads model_k: its eval, or iteration
        k+1's search, data or fine-tune (which starts from it)."""
        s, lay = self.settings, self.layout
        if not s.stop_after and (finished(lay.eval(k, variant), "eval") is None or s.eval_samples > 1
                                 and finished(lay.sampled_eval(k, variant), "sampled eval") is None):
            return True
        if k >= s.last_iteration[variant]:
            return False
        if any(finished(folder, name) is None for folder, name in ((lay.trees(k + 1, variant), "search"), (
                lay.data(k + 1, variant), "data"), (lay.model(k + 1, variant), "train"))):
            return True
        if self.trained(k + 1, variant) and lay.hf(k + 1, variant).exists():
            return False   # model_{k+1} is made and here
        return self.model_needed(k + 1, variant)   # it starts from model_k, or is model_k (no samples)

    def train_once(self, k: int, variant: str, model_dir: Path, work: Callable[[], dict]) -> dict:
        """The train stage of model_k. A finished fine-tune whose weights are
        gone (a run restored from its small state: reproduction/pieces.py) is
        rebuilt from its adapter (LORA_RANK), else redone, only where a stage
        still to run reads the model; one process at a time, so runs that
        share an iteration (pieces) make it once."""
        with locked(model_dir):
            if self.trained(k, variant) and not self.layout.hf(k, variant).exists() and self.model_needed(k, variant) \
                    and not self.rebuild(k, variant):
                log.warning("model_%d of %s is gone (%s): fine-tuning it again", k, variant, model_dir)
                (model_dir / MARKER).unlink()
            return self.stage(k, variant, "train", model_dir, work)

    def rebuild(self, k: int, variant: str) -> bool:
        """model_k from its adapter merged into the model it was fine-tuned
        from (that one rebuilt first where it is gone too): seconds, where a
        fine-tune takes hours. False where there is no adapter, or the merge
        does not give the weights the adapter's record names (then the
        model is fine-tuned again)."""
        adapter, hf = self.layout.adapter(k, variant), self.layout.hf(k, variant)
        try:
            want = read_json(adapter / ADAPTER_RECORD)[CHECKSUM]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        start, _ = self.training_plan(k, variant, self.model(k - 1, variant))
        if not Path(start).exists() and not (k > 1 and self.rebuild(k - 1, variant)):
            return False
        got = apply_adapter(start, adapter, hf)
        if got != want:
            log.warning("model_%d of %s rebuilt from %s has weights %s, not the %s its record names", k, variant,
                        adapter, got[:12], want[:12])
            shutil.rmtree(hf, ignore_errors=True)
            return False
        log.info("model_%d of %s rebuilt from its adapter (%s): weights sha256 %s", k, variant, adapter, got[:12])
        return True

    def sampled(self, k: int, variant: str, model: Policy) -> dict:
        """EVAL_SAMPLES > 1: the row's ``sampled`` eval (Pass@k), a stage of its own."""
        if self.settings.eval_samples == 1:
            return {}
        folder = self.layout.sampled_eval(k, variant)
        return {"sampled": self.stage(k, variant, "sampled eval", folder,
                                      lambda: stages.sampled_eval_stage(self.settings, self.pool, folder, model))}

    def revise_source(self) -> Optional[Path]:
        """The folder of the revision task's rows: the base model's env eval
        writes them from its failures, and every eval reads those rows under
        either WAIT_REPLY (else the two could not be paired). None: this
        run's base eval writes them (the env run, or an ok run whose env base
        eval is missing)."""
        s, env_base = self.settings, self.layout.eval(0, BASE, "env", "")
        if (s.wait_reply != "env" or s.eval_tag) and all(revise_tasks_file(env_base, t).exists() for t in s.tasks):
            return env_base
        return None

    def base_row(self) -> dict:
        s, folder = self.settings, self.layout.eval(0, BASE)
        source = self.revise_source()
        if source is None and (s.wait_reply != "env" or s.eval_tag) and s.revise_limit != 0:
            log.warning("the run's base eval has no revision-task rows in %s, so this base eval (%s) writes its own",
                        self.layout.eval(0, BASE, "env", ""), folder)
        stats = self.stage(0, BASE, "eval", folder,
                           lambda: stages.eval_stage(s, self.pool, folder, self.base, source))
        return self.finish_row({"iteration": 0, "variant": BASE, "model": self.layout.shown(self.base.model_dir),
                                "started_from": None, **stats, **self.sampled(0, BASE, self.base)})

    def iteration_row(self, k: int, variant: str) -> Optional[dict]:
        """Iteration k of ``variant``, its row; None where STOP_AFTER=data ends
        it early: after the data stage in the last iteration, after the
        fine-tune (which the next search needs) before it."""
        s, lay = self.settings, self.layout
        prev = self.model(k - 1, variant)
        trees = lay.trees(k, BASE if k == 1 else variant)
        if (finished(trees, "search") is not None and finished(lay.data(k, variant), "data") is None
                and not any(trees.rglob(f"{RESULT_PREFIX}*.json"))):
            log.warning("the trees of %s are gone and its data stage still needs them: searching again", trees)
            (trees / MARKER).unlink()
        searched = self.stage(k, variant, "search", trees, lambda: stages.search_stage(s, self.pool, trees, prev))
        data_dir = lay.data(k, variant)
        export = lay.export(k, variant)
        data = self.stage(k, variant, "data", data_dir, lambda: (
            trl_stages.data_stage(s, trees, data_dir, prev, export) if variant == trl_stages.ETO
            else stages.data_stage(s, self.pool, trees, data_dir, variant, prev, export, k)))
        if s.stop_after and k == s.iterations:
            return None
        start, files, trained = self.fine_tune(k, variant, prev)
        if s.stop_after:
            return None
        model = self.model(k, variant)
        evals = self.stage(k, variant, "eval", lay.eval(k, variant), lambda: stages.eval_stage(
            s, self.pool, lay.eval(k, variant), model, self.revise_source() or lay.eval(0, BASE)))
        return self.finish_row({"iteration": k, "variant": variant, "model": lay.shown(model.model_dir),
                                "started_from": lay.shown(start if files else prev.model_dir), **evals,
                                **self.sampled(k, variant, model),
                                "search": searched, "data": data, "train": trained,
                                **self.training_settings(k, variant)})

    def fine_tune(self, k: int, variant: str, prev: Policy) -> tuple[str, list[str], dict]:
        """The train stage of model_k: (the model it starts from, its data files, the stage's statistics)."""
        start, files = self.training_plan(k, variant, prev)
        model_dir = self.layout.model(k, variant)
        trainer = trl_stages.DPO_TRAINER if variant == trl_stages.ETO else self.trainer
        trained = self.train_once(k, variant, model_dir, lambda: self.train(start, files, model_dir, trainer, k))
        return start, files, trained

    def training_settings(self, k: int, variant: str) -> dict:
        """The settings model_k of ``variant`` is made with, from the config
        its own trainer gets: the eto variant's DPO reads ETO_EPOCHS, ETO_LR
        and ETO_BETA and pairs full-score paths (no ALPHA); the fine-tuning
        variants read ALPHA, this iteration's EPOCHS and LR."""
        s = self.settings
        knobs = s.train_knobs(k)
        if variant == trl_stages.ETO:
            return trl_stages.eto_settings(trl_stages.eto_config(s, knobs))
        return {"alpha": {t: s.alpha_for(t, k) for t in s.tasks}, "epochs": knobs.epochs, "lr": knobs.lr}

    def training_plan(self, k: int, variant: str, prev: Policy) -> tuple[str, list[str]]:
        """(the model fine-tuned, the export files it learns from) for model_k:
        TRAIN_FROM=previous fine-tunes model_{k-1} on iteration k's export,
        base fine-tunes the base model on the exports of iterations 1..k."""
        if self.settings.train_from == "base":
            start, rounds = resolve_model_dir(self.base.model_dir), range(1, k + 1)
        elif prev is self.base:
            start, rounds = resolve_model_dir(prev.model_dir), range(k, k + 1)
        else:   # model_{k-1}, in the run; its weights may be gone where no stage reads them (train_once)
            start, rounds = str(Path(prev.model_dir).resolve()), range(k, k + 1)
        files = [str(self.layout.export(j, variant)) for j in rounds if self.layout.export(j, variant).exists()]
        return start, files

    def train(self, start: str, files: list[str], out: Path, trainer: str, k: int) -> dict:
        if not files:
            log.warning("no training samples: %s keeps the model it started from", out)
            return {"trainer": None, "skipped": "no training samples"}
        return train_stage(self.settings, self.pool, trainer, start, files, out,
                           self.settings.train_knobs(k))


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


def leave_out_taught_tasks(s: IterateSettings, base_dir: str, root: Path) -> dict[str, dict]:
    """The searches skip the train tasks the base model was trained on (its
    training_tasks.json, agent_r/loop/search_tasks.py): the rest go to a task
    list in the run folder that the search reads instead. Nothing is written
    unless a task is left out; none left to search is a usage error."""
    # imported here: ``python -m agent_r.loop.search_tasks`` must not find it imported by the package
    from agent_r.loop.search_tasks import plan_exclusions, split_file_path, write_task_list

    if s.iterations == 0 or not Path(base_dir).is_dir():
        return {}
    base = policy(s.backend, BASE, base_dir)

    def candidates(task: str) -> list[int]:
        return get_env(task).search_indices(search_settings(s, task, root, base), s.servers[task])[0]

    plans = plan_exclusions(base_dir, s.tasks, candidates)
    for task, got in plans.items():
        if not got["taught_left_out"]:
            continue
        if get_env(task).name == "sciworld":
            raise UsageError(f"{got['taught_left_out']} of the SciWorld tasks chosen for the search are tasks "
                             f"MODEL_DIR {base_dir} was trained on, and the SciWorld search takes task numbers, not "
                             "a task list: choose --min/--max (task numbers) that avoid them")
        path = split_file_path(root, task)
        write_task_list(path, got["searched"], task)
        s.search_split[task] = str(path)
    return {t: {**{k: v for k, v in got.items() if k != "searched"}, "searched": len(got["searched"]),
                "task_list": s.search_split.get(t, s.split_file)} for t, got in plans.items()}


def fine_tune_settings(s: IterateSettings) -> Optional[dict]:
    """What an adapter record says of this run's LORA_RANK (None: full fine-tunes)."""
    return lora_record(Lora(rank=s.lora_rank, alpha=2 * s.lora_rank))["lora"] if s.lora_rank else None


def redo_other_fine_tunes(s: IterateSettings, layout: Layout) -> None:
    """A rerun with another LORA_RANK (or a full fine-tune where adapters
    were trained) fine-tunes again, not the old model reused: from the first
    iteration of each variant whose finished fine-tune was made otherwise,
    its fine-tunes and evals (under every reply and tag) are redone, and the
    later iterations' searches and data too (they were made by the old
    models); iteration k's own search and data, made by model_{k-1}, stay."""
    want = fine_tune_settings(s)
    for variant in s.variant_list:
        for k in range(1, s.last_iteration[variant] + 1):
            if finished(layout.model(k, variant), "train") is None:
                continue
            record = layout.adapter(k, variant) / ADAPTER_RECORD
            try:
                have = read_json(record).get("lora") if record.exists() else None
            except (OSError, ValueError, AttributeError):
                have = None
            if have == want:
                continue
            log.warning("model_%d of %s was fine-tuned with %s, this run asks %s: fine-tuning it again, and "
                        "redoing what later iterations of %s built on it", k, variant,
                        f"LoRA {have}" if have else "a full fine-tune", f"LoRA {want}" if want else "a full one",
                        variant)
            for j in range(k, s.last_iteration[variant] + 1):
                # whole folders: a TRL run there (eto's DPO) would refuse its other settings, and the
                # old model's episodes and trees must not be resumed as the new model's
                stale = [layout.model(j, variant), *layout.iteration(j).glob(f"eval*/{variant}")]
                if j > k:
                    stale += [layout.trees(j, variant), layout.data(j, variant)]
                for folder in stale:
                    shutil.rmtree(folder, ignore_errors=True)
            break


def check_wait_reply(layout: Layout) -> None:
    """The ``eval`` folders hold the env-reply evals; WAIT_REPLY=ok has its
    own (``eval_wait_ok``). A run evaluated with WAIT_REPLY=ok before the
    folders were split holds ok-evals under ``eval``: reading them as env
    evals would mix both settings in one table, so it stops here instead.
    Evals finished before the setting existed used the env's answer."""
    for marker in sorted(layout.root.glob(f"iter_*/eval/*/{MARKER}")):
        try:
            used = read_json(marker)["stats"].get("wait_reply", "env")
        except (ValueError, OSError, KeyError, TypeError, AttributeError):
            continue   # unreadable: run_stage redoes that stage anyway
        if used != "env":
            raise UsageError(f"{marker.parent} holds an eval with WAIT_REPLY={used}, where env evals belong: move "
                             f"iter_<k>/eval/ of run {layout.root} to iter_<k>/eval_wait_{used}/ (and results.* to "
                             f"results_wait_{used}.*), then rerun")


def stage_count(s: IterateSettings) -> int:
    if s.stop_after:   # no eval; the last iteration stops after its data stage
        return sum(k * 3 - 1 if k == s.iterations else k * 3 for k in s.last_iteration.values())
    evals = 1 + sum(s.last_iteration.values())   # a sampled eval beside each greedy one
    return 1 + sum(s.last_iteration.values()) * STAGES_PER_ITERATION + (evals if s.eval_samples > 1 else 0)


def run(s: IterateSettings) -> LoopResult:
    """iterate.py's whole job; resumes a run of the same name."""
    base_dir, trainer = check_inputs(s)
    layout = Layout(Path(s.runs_dir) / s.name, s.wait_reply, s.eval_tag)
    check_wait_reply(layout)
    redo_other_fine_tunes(s, layout)
    s.search_tasks = leave_out_taught_tasks(s, base_dir, layout.root)
    # one engine serves every stage: sized for the largest prompt budget (eval's by default)
    pool = ModelPool(s.seed, (s.max_token_length or EVAL_PROMPT_BUDGET) + s.max_new_tokens)
    loop = Loop(s, layout, pool, trainer, policy(s.backend, BASE, base_dir))
    incomplete = None
    try:
        with tqdm(total=stage_count(s), unit="stage") as loop.progress:
            if not s.stop_after:
                loop.base_row()
                write_results(s, layout, loop.rows, trainer)
            for k in range(1, s.iterations + 1):
                for variant in s.variants_at(k):
                    if loop.iteration_row(k, variant) is not None:
                        write_results(s, layout, loop.rows, trainer)
    except StageIncomplete as exc:
        incomplete = f"{exc}; rerun the same command to retry (finished stages are kept)"
    finally:
        loop.pool.close()
    if loop.rows:
        write_results(s, layout, loop.rows, trainer)
    table = (markdown(s, loop.rows) if not s.stop_after else
             f"STOP_AFTER=data: the search and data stages of iteration {s.iterations} are done in {layout.root} "
             "(nothing was evaluated)")
    return LoopResult(layout.root, loop.rows, table, incomplete)
