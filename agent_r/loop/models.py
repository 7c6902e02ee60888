"""The loop's models: which model each stage uses (``Policy``) and one live
backend at a time (``ModelPool``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from agent_r.knobs import BackendSettings
from agent_r.llm import LazyBackend, make_backend


@dataclass
class Policy:
    """A model of the loop: where it is and how the backend settings name it."""

    label: str                 # base, or <variant>-iter<k>
    model_dir: str
    backend: BackendSettings


def policy(backend: BackendSettings, label: str, model_dir: str) -> Policy:
    """Backend settings for one model: MODEL_DIR replaced and output folders
    named by the label (the openai backend is left as set: it serves one
    model, which only iteration 0 can use)."""
    if (backend.backend or "").strip() == "openai":
        return Policy(label, model_dir, backend)
    return Policy(label, model_dir, dataclasses.replace(backend, model_dir=model_dir, model_name=label))


class ModelPool:
    """One backend at a time, kept while consecutive stages use the same model
    (search and verifier of model_{k-1}; eval and revision task of model_k),
    closed before training so an accelerator is free for the trainer. The
    backend is made at its first use: a stage whose items are all done (a
    resumed run) loads no model."""

    def __init__(self, seed: int, max_model_len: int):
        self.seed, self.max_model_len = seed, max_model_len
        self.key: Optional[str] = None
        self.current: Optional[LazyBackend] = None

    def backend(self, p: Policy) -> LazyBackend:
        """``p``'s backend (the same object while ``p`` stays in use)."""
        if self.current is None or self.key != p.model_dir:
            self.close()
            self.current = LazyBackend(lambda: make_backend(p.backend, seed=self.seed,
                                                            max_model_len=self.max_model_len))
            self.key = p.model_dir
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
        self.current, self.key = None, None
