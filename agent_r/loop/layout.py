"""Where one run of the loop keeps its files, under ``runs/<name>/``:

  iter_0/eval/base/            the base model's eval and the revision-task files
  iter_<k>/trees/<policy>/     the search of iteration k (policy ``base`` for
                               k = 1, shared by the variants, else the variant)
  iter_<k>/data/<variant>/     revision and good rows, ``train.json`` (the export;
                               eto: its DPO pairs)
  iter_<k>/model/<variant>/    ``hf/`` (model_k), ``xtuner/`` with TRAINER=xtuner
  iter_<k>/eval/<variant>/     model_k's eval (eval.py's layout)
  results.json, results.md, results.png

Every stage folder also gets a done-marker (agent_r/loop/stages.py).
"""
from __future__ import annotations

from pathlib import Path

BASE = "base"   # the label of model_0 and of iteration 1's shared search
RESULTS_JSON, RESULTS_MD, RESULTS_PNG = "results.json", "results.md", "results.png"
EXPORT_FILE = "train.json"
HF_DIR, XTUNER_DIR = "hf", "xtuner"   # inside a model folder


class Layout:
    """The paths of one run."""

    def __init__(self, root: Path):
        self.root = root

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

    def eval(self, k: int, variant: str) -> Path:
        return self.iteration(k) / "eval" / variant

    def results(self, name: str) -> Path:
        return self.root / name

    def shown(self, path: str | Path) -> str:
        """A path as results show it: relative to the run when inside it, so
        two runs of the same settings give equal results."""
        try:
            return str(Path(path).resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)
