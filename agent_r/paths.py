"""Where every artefact of a run lives and what it is called: tree files and
their folder, eval result files and their run folder, revision JSONL files,
the per-tree part cache, manifests, summaries, the viewer's pages and the
self-training loop's run folder (``Layout``).

Why one module: the scripts, the loop, the viewer, the benches and the tests
all read what another one wrote. When each spelled a name itself they drifted
(a reader looked for trees where the writer had not put them); here a name
has one spelling and a folder one rule.

Why model names are made folder-safe (``folder_name``): a run's folder is
named after its model, and a served model's name is often a path (what
``vllm serve /models/llama`` serves) or a hub id (``org/name``). Joined as is,
``/models/llama`` puts the output at ``/models/llama_eval``, outside the run's
output root, and ``org/name`` nests folders. A plain name is used unchanged, so
every folder the reference scripts made keeps its name.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Protocol

from agent_r.envs import get_env
from agent_r.knobs import BackendSettings, resolved_model_name
from agent_r.llm import BUNDLED_MODEL
from agent_r.settings import UsageError


# What a folder rule reads of a stage's settings. Protocols, not the settings
# classes: those live with their stages, which import this module.
class SearchSettings(Protocol):
    output_dir: str
    task: Optional[str]
    backend: BackendSettings


class EvalSettings(SearchSettings, Protocol):
    model_type: str
    revise_from: Optional[str]
    wait_reply: str


class PathSettings(SearchSettings, Protocol):
    data_type: str
    input_dir: Optional[str]

# The reference's name for both a search tree and an eval result: search_results_<idx>.json
RESULT_PREFIX = "search_results_"
TREE_FILE = re.compile(r"^search_results_(\d+)\.json$")
MANIFEST = "manifest.json"          # beside a run's outputs; a shard's is manifest.shard-<i>-of-<N>.json
SUMMARY = "summary.json"            # an eval run's numbers, recomputed from every result file
PARTS = ".parts"                    # path_collection.py's per-tree results, under its --output_dir
VIEWER_INDEX = "index.html"         # the viewer's page listing every tree of a folder
SEARCH_ROOT = "mcts_result"         # mcts_collection.py's default --output_dir

_SEPARATOR = re.compile(r"[\\/]+")


# --------------------------------------------------------------------------- paths in committed files

REPOSITORY = Path(__file__).resolve().parents[1]


def portable(path: str | Path, root: str | Path | None = None) -> str:
    """A path as a results file records it: relative to ``root`` (a run's
    folder) when inside it, else relative to the repository when inside it,
    else as given. Why: results are committed and compared across machines,
    and the folder a checkout or a run happened to lie in says nothing about
    what was run; a model is named by where it lies in the repository (and
    by its weights' sha256, ``agent_r.llm.weights_sha256``)."""
    resolved = Path(path).expanduser().resolve()
    for base in ([Path(root).resolve()] if root is not None else []) + [REPOSITORY]:
        try:
            return resolved.relative_to(base).as_posix() or "."
        except ValueError:
            continue
    return str(path)


def portable_paths(value: Any, root: str | Path | None = None) -> Any:
    """``value`` (a JSON document) with every absolute path string, and each
    absolute path of a comma-separated list, made ``portable``."""
    if isinstance(value, dict):
        return {k: portable_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v, root) for v in value]
    if isinstance(value, str) and _path_list(value):
        return ",".join(portable(part, root) if part.startswith(("/", "~")) else part for part in value.split(","))
    return value


def _path_list(value: str) -> bool:
    """An absolute path, or a comma-separated list of paths one of which is
    absolute (none holding whitespace: a sentence is not a list of paths)."""
    if value.startswith(("/", "~")) and "\n" not in value:
        return True
    return any(p.startswith(("/", "~")) for p in value.split(",")) and not any(c.isspace() for c in value)


# --------------------------------------------------------------------------- names

def folder_name(name: str) -> str:
    """``name`` as one path component that stays inside its parent folder.

    A name without a path separator is returned unchanged. A path (absolute,
    starting with ``.`` or ``~``, or of three or more parts) gives its last
    part: ``/models/llama`` -> ``llama``. A hub id ``org/name`` gives
    ``org--name``, keeping the organisation so two orgs' models of one name
    get two folders. Raises UsageError for a name that leaves no folder
    (``/``, ``..``)."""
    if not _SEPARATOR.search(name):
        if name in (".", ".."):
            raise UsageError(f"the model name {name!r} cannot name a folder: set MODEL_NAME (--model_name) "
                             "to a plain name such as my-model")
        return name
    text = name.strip()
    parts = [p for p in _SEPARATOR.split(text) if p]
    path_like = text[:1] in ("/", "\\", ".", "~") or len(parts) > 2 or (parts and parts[0].endswith(":"))
    if path_like:
        parts = [p for p in parts if p not in (".", "..")][-1:]
    if not parts or parts == [".."]:
        raise UsageError(f"the model name {name!r} cannot name a folder: set MODEL_NAME (--model_name) "
                         "to a plain name such as my-model")
    return "--".join(parts)


def model_name(backend: BackendSettings) -> str:
    """The model's name as manifests and result files record it (unchanged)."""
    return resolved_model_name(backend, BUNDLED_MODEL.name)


def model_folder(backend: BackendSettings) -> str:
    """The folder named after the model: ``folder_name(model_name(backend))``."""
    return folder_name(model_name(backend))


# --------------------------------------------------------------------------- search trees

def tree_dir(settings: SearchSettings) -> Path:
    """The folder mcts_collection.py writes its trees and manifest to:
    ``{output_dir}/{TASK}/{model folder}``. The one place a search's folder is
    chosen; whoever reads a search's trees (path_collection.py, the loop)
    asks here."""
    return search_folder(settings.output_dir, settings.task, settings.backend)


def search_folder(output_dir: str | Path, task: str, backend: BackendSettings) -> Path:
    """``{output_dir}/{TASK}/{model folder}`` for a search of ``task`` by the
    model ``backend`` names."""
    return Path(output_dir) / get_env(task).name / model_folder(backend)


def task_of(path: str | Path) -> str | None:
    """The environment a path's folders name (``.../<TASK>/<model>/...``, the
    nearest one to the file), None when no folder is an environment's name."""
    for part in reversed(Path(path).resolve().parts):
        try:
            if get_env(part).name == part:
                return part
        except UsageError:
            continue
    return None


def tree_file(folder: str | Path, idx: int) -> Path:
    return Path(folder) / f"{RESULT_PREFIX}{idx}.json"


def tree_index(path: str | Path) -> int | None:
    """The task index of a tree file's name, None for any other file."""
    m = TREE_FILE.match(Path(path).name)
    return int(m.group(1)) if m else None


def tree_files(folder: str | Path) -> list[tuple[int, Path]]:
    """(index, path) of the tree files directly in ``folder``, in index order;
    manifests, temp files and anything else are not trees."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = ((tree_index(p), p) for p in folder.iterdir())
    return sorted((idx, p) for idx, p in found if idx is not None)


def find_tree_files(folder: str | Path) -> list[Path]:
    """Tree files under ``folder`` at any depth, by folder then index."""
    found = [p for p in Path(folder).rglob(f"{RESULT_PREFIX}*.json") if tree_index(p) is not None]
    return sorted(found, key=lambda p: (str(p.parent), tree_index(p)))


# --------------------------------------------------------------------------- eval runs

def eval_dir(settings: EvalSettings) -> Path:
    """The folder of one eval.py run: ``{output_dir}/{TASK}/{model
    folder}_{MODEL_TYPE}``, plus ``_revise`` for the revision task, plus
    ``_samples<K>`` with ``--samples K`` > 1, plus ``_wait_ok`` with
    WAIT_REPLY=ok (the defaults add nothing, so those folders keep their
    names and the settings never share one)."""
    sampled = f"_samples{settings.eval_samples}" if settings.eval_samples > 1 else ""
    suffix = ("_revise" if settings.revise_from else "") + sampled + wait_reply_suffix(settings.wait_reply)
    name = f"{model_folder(settings.backend)}_{folder_name(settings.model_type)}{suffix}"
    return Path(settings.output_dir) / get_env(settings.task or "").name / name


def wait_reply_suffix(wait_reply: str) -> str:
    return "" if wait_reply == "env" else f"_wait_{wait_reply}"


def result_file(run_dir: str | Path, key: str) -> Path:
    """One episode's result: the reference's name, keyed by task (``12``) or
    revise row (``12_0``)."""
    return Path(run_dir) / f"{RESULT_PREFIX}{key}.json"


def result_files(run_dir: str | Path) -> list[Path]:
    """Every episode's result file of a run folder, by file name."""
    return sorted(Path(run_dir).glob(f"{RESULT_PREFIX}*.json"))


def summary_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / SUMMARY


def manifest_file(folder: str | Path, name: str = MANIFEST) -> Path:
    """A run's manifest in ``folder`` (``name``: a shard's, see agent_r.sharding)."""
    return Path(folder) / name


# --------------------------------------------------------------------------- revision data

def revision_file(settings: PathSettings) -> Path:
    """path_collection.py's rows: ``{output_dir}/{TASK}_{data_type}.jsonl``."""
    return Path(settings.output_dir) / f"{get_env(settings.task or '').name}_{settings.data_type}.jsonl"


def revision_manifest(jsonl: str | Path) -> Path:
    """The manifest beside a JSONL file: ``{TASK}_{data_type}.manifest.json``."""
    jsonl = Path(jsonl)
    return jsonl.with_name(f"{jsonl.stem}.manifest.json")


def parts_dir(settings: PathSettings) -> Path:
    """The part cache of one (TASK, data_type): ``{output_dir}/.parts/{TASK}_{data_type}``."""
    return Path(settings.output_dir) / PARTS / revision_file(settings).stem


def part_file(folder: str | Path, idx: int) -> Path:
    return Path(folder) / f"{idx}.json"


def revision_inputs(settings: PathSettings) -> list[Path]:
    """Where path_collection.py looks for trees, in order; the first folder
    holding trees is read.

    * ``--input_dir D``: D itself, else D's search folder (D as the
      ``--output_dir`` of mcts_collection.py: ``D/{TASK}/{model folder}``).
    * unset: the search folder under this run's ``--output_dir`` (both scripts
      given one --output_dir), else the one under mcts_result (both scripts'
      defaults, the reference's layout)."""
    task, given = settings.task or "", _given_input(settings)
    if given is not None:
        return [Path(given), search_folder(given, task, settings.backend)]
    return list(dict.fromkeys([search_folder(settings.output_dir, task, settings.backend),
                               search_folder(SEARCH_ROOT, task, settings.backend)]))


def revision_input(settings: PathSettings) -> Path:
    """The folder of trees path_collection.py reads (``revision_inputs``);
    UsageError naming where it looked when none holds a tree."""
    candidates = revision_inputs(settings)
    for folder in candidates:
        if tree_files(folder):
            return folder
    given = _given_input(settings)
    shown = given if given is not None else " or ".join(map(str, candidates))
    if not any(c.is_dir() for c in candidates):
        raise UsageError(f"input dir {shown} does not exist: run mcts_collection.py first, "
                         "or pass --input_dir (or set MODEL_NAME) to point at its trees")
    raise UsageError(f"input dir {shown} has no search_results_<idx>.json trees: run "
                     "mcts_collection.py first, or pass --input_dir pointing at its output")


def _given_input(settings: Any) -> str | None:
    """--input_dir as the user gave it, None when unset. ``PathSettings.finish``
    fills an unset one with the model name joined as is; that value means
    "not given"."""
    filled = str(Path(SEARCH_ROOT) / get_env(settings.task or "").name / model_name(settings.backend))
    return None if settings.input_dir in (None, filled) else settings.input_dir


# --------------------------------------------------------------------------- viewer

def viewer_index(out_dir: str | Path) -> Path:
    return Path(out_dir) / VIEWER_INDEX


def viewer_page(out_dir: str | Path, tree: str | Path) -> Path:
    """The page of ``tree`` (a path relative to the folder viewed) under ``out_dir``."""
    return Path(out_dir) / Path(tree).with_suffix(".html")


# --------------------------------------------------------------------------- the loop's run folder

# Where one run of the loop keeps its files, under ``runs/<name>/``:
#
#   iter_0/eval/base/            the base model's eval and the revision-task files
#   iter_<k>/trees/<policy>/     the search of iteration k (policy ``base`` for
#                                k = 1, shared by the variants, else the variant)
#   iter_<k>/data/<variant>/     revision and good rows, ``train.json`` (the export;
#                                eto: its DPO pairs)
#   iter_<k>/model/<variant>/    ``hf/`` (model_k), ``xtuner/`` with TRAINER=xtuner
#   iter_<k>/eval/<variant>/     model_k's eval (eval.py's layout)
#   iter_<k>/eval_wait_ok/<variant>/  the same with WAIT_REPLY=ok
#   iter_<k>/eval_<tag>[_wait_ok]/    the same with EVAL_TAG=<tag>
#   results.json, results.md, results.png, losses.png
#   results[_<tag>][_wait_ok].{json,md,png}   the table of those evals
#
# Every stage folder also gets a done-marker (agent_r/loop/stages.py).

BASE = "base"   # the label of model_0 and of iteration 1's shared search
RESULTS_JSON, RESULTS_MD, RESULTS_PNG = "results.json", "results.md", "results.png"
LOSSES_PNG = "losses.png"   # every fine-tune's training loss per step
EXPORT_FILE = "train.json"
HF_DIR, XTUNER_DIR, ADAPTER_DIR = "hf", "xtuner", "adapter"   # inside a model folder
CHECKPOINT_DIR = "checkpoint"   # inside a model folder: the CPU trainer's step checkpoint while it trains


class Layout:
    """The paths of one run. ``wait_reply`` picks the evals' folders: each
    WAIT_REPLY has its own (``eval``, ``eval_wait_ok``) and its own results
    table, so one run's models are scored under both replies side by side
    and compared episode by episode."""

    def __init__(self, root: Path, wait_reply: str = "env", tag: str = ""):
        self.root = root
        self.wait_reply = wait_reply
        self.tag = tag   # EVAL_TAG: evals made under other conditions (another dtype, machine), kept apart

    def eval_suffix(self, wait_reply: Optional[str] = None, tag: Optional[str] = None) -> str:
        tag = self.tag if tag is None else tag
        return (f"_{tag}" if tag else "") + wait_reply_suffix(wait_reply or self.wait_reply)

    def iteration(self, k: int) -> Path:
        return self.root / f"iter_{k}"

    def trees(self, k: int, policy: str) -> Path:
        return self.iteration(k) / "trees" / policy

    def data(self, k: int, variant: str) -> Path:
        return self.iteration(k) / "data" / variant

    def export(self, k: int, variant: str) -> Path:
        """The training file of iteration k's data stage."""
        return self.data(k, variant) / EXPORT_FILE

    def model(self, k: int, variant: str) -> Path:
        return self.iteration(k) / "model" / variant

    def hf(self, k: int, variant: str) -> Path:
        """model_k as a Hugging Face directory."""
        return self.model(k, variant) / HF_DIR

    def adapter(self, k: int, variant: str) -> Path:
        """model_k's LoRA adapter (LORA_RANK): model_{k-1} plus it is model_k."""
        return self.model(k, variant) / ADAPTER_DIR

    def eval(self, k: int, variant: str, wait_reply: Optional[str] = None, tag: Optional[str] = None) -> Path:
        """model_k's eval under ``wait_reply`` and ``tag`` (default: the layout's)."""
        return self.iteration(k) / f"eval{self.eval_suffix(wait_reply, tag)}" / variant

    def sampled_eval(self, k: int, variant: str) -> Path:
        """EVAL_SAMPLES' eval of model_k, beside the greedy one (its own done-marker)."""
        return self.eval(k, variant) / "sampled"

    def results(self, name: str) -> Path:
        """``results.json`` and the like; ``results_wait_ok.json`` with WAIT_REPLY=ok,
        ``results_<tag>.json`` with EVAL_TAG."""
        stem, dot, ext = name.rpartition(".")
        return self.root / f"{stem}{self.eval_suffix()}{dot}{ext}"

    def shown(self, path: str | Path) -> str:
        """A path as results show it (``portable``): relative to the run when
        inside it, so two runs of the same settings give equal results."""
        return portable(path, self.root)
