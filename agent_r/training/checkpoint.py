"""Step checkpoints of the in-process trainer: a fine-tune that outlasts its
machine goes on where it stopped.

Why: on a 2-core box a SmolLM2 fine-tune of a few hundred samples takes one
to three hours, and the machines such a run gets may last less, keeping only
what was committed. A LoRA fine-tune's state is small (the adapter's weights
in fp32 and AdamW's two moments: ~60 MB for rank 16 on SmolLM2-135M), so it
is saved every few minutes, banked with the run, and a rerun continues from
it. The step plan is a pure function of the data, the knobs and the seed and
no step draws random numbers (no dropout), so the resumed run writes the same
weights as one that was never stopped.

The folder holds ``trainable.safetensors`` (every parameter that trains),
``optimizer.pt`` and ``progress.json`` (steps done, their losses, the key of
the inputs, whether only an adapter trains: a run banks only those, and
the segments: which steps ran on which machine in which precision, since a
run resumed elsewhere may mix them and its record must say so); it is
replaced whole (write beside, then rename), so a kill
mid-save leaves the previous checkpoint. A checkpoint of other inputs (start
model, data, knobs, seed, adapter settings) is never resumed: it is dropped
with a warning and the fine-tune starts over.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from agent_r.io import atomic_write_json, file_sha256, read_json

log = logging.getLogger(__name__)

PROGRESS = "progress.json"
TRAINABLE = "trainable.safetensors"
OPTIMIZER = "optimizer.pt"


def inputs_key(model_dir: str, data_files: list[str], settings: dict) -> str:
    """What the run learns from and how: the start model's and data files'
    bytes and every setting that changes the trained weights."""
    from agent_r.llm.model_files import weights_sha256

    parts = {"model": weights_sha256(model_dir), "data": [file_sha256(f) for f in data_files], "settings": settings}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class StepCheckpoint:
    """A fine-tune's resumable state in ``folder``, saved at most every
    ``every_s`` seconds (0: after every step)."""

    def __init__(self, folder: str | Path, key: str, every_s: float = 600.0, adapter: bool = False,
                 here: dict | None = None) -> None:
        self.folder, self.key, self.every_s, self.adapter = Path(folder), key, every_s, adapter
        self.saved_at = time.monotonic()
        self.resumed_from = 0   # the step this process's run went on from
        self.here = here or {}   # what this process's steps ran on (machine, precision)
        self.earlier: list[dict] = []   # the segments of the processes before it

    def segments(self, step: int) -> list[dict]:
        """Which steps ran where, up to ``step``: one entry per process that
        ran some, earliest first."""
        mine = [{"from_step": self.resumed_from, "to_step": step, **self.here}] if step > self.resumed_from else []
        return self.earlier + mine

    def resume(self, model: Any, opt: Any) -> tuple[int, list[float]]:
        """(steps done, their losses), with the model's trainable weights and
        the optimizer's state loaded; (0, []) when there is nothing to resume."""
        import torch
        from safetensors.torch import load_file

        old = self.folder.with_name(self.folder.name + ".old")
        if not self.folder.exists() and old.exists():   # killed between the two renames of a save
            old.rename(self.folder)
        progress = self.folder / PROGRESS
        if not progress.exists():
            return 0, []
        try:
            done = read_json(progress)
            if done.get("key") != self.key:
                log.warning("%s holds a checkpoint of other inputs (model, data or settings): starting over",
                            self.folder)
                self.remove()
                return 0, []
            weights = load_file(str(self.folder / TRAINABLE))
            state = torch.load(self.folder / OPTIMIZER, weights_only=True)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("%s is unreadable (%s): starting over", self.folder, exc)
            self.remove()
            return 0, []
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)
        opt.load_state_dict(state)
        log.info("resuming %s at step %d", self.folder.parent, done["step"])
        self.resumed_from = int(done["step"])
        # a checkpoint saved before segments were recorded: its steps ran somewhere unrecorded
        self.earlier = list(done.get("segments") or [{"from_step": 0, "to_step": self.resumed_from}])
        return self.resumed_from, list(done["losses"])

    def maybe_save(self, step: int, losses: list[float], model: Any, opt: Any, last: bool = False) -> None:
        """Save unless one was saved less than ``every_s`` ago; never after
        the last step (the finished model replaces the checkpoint)."""
        if last or time.monotonic() - self.saved_at < self.every_s:
            return
        self.save(step, losses, model, opt)

    def save(self, step: int, losses: list[float], model: Any, opt: Any) -> None:
        import torch
        from safetensors.torch import save_file

        part = self.folder.with_name(self.folder.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        save_file({n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad},
                  str(part / TRAINABLE))
        torch.save(opt.state_dict(), part / OPTIMIZER)
        atomic_write_json(part / PROGRESS, {"key": self.key, "step": step, "adapter": self.adapter, "losses": losses,
                                                "segments": self.segments(step)})
        old = self.folder.with_name(self.folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.folder.exists():
            self.folder.rename(old)
        part.rename(self.folder)
        shutil.rmtree(old, ignore_errors=True)
        self.saved_at = time.monotonic()
        log.info("checkpoint at step %d in %s", step, self.folder)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
