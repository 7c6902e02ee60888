"""Step checkpoints of the in-process trainer: a fine-tune that outlasts its
machine goes on where it stopped.

Why: on a 2-core box a SmolLM2 fine-tune of a few hundred samples takes one
to three hours, and the machines such a run gets may last less, keeping only
what was committed. So every few minutes the fine-tune's state is saved, a
LoRA run's is banked with the run, and a rerun continues from it.

What is saved is what a resume needs at half the bytes of the fp32 state
(``state.safetensors.gz``, about 23 MB for rank 16 on SmolLM2-135M where the
fp32 adapter and AdamW's moments took 57 MB, and every banked copy stays in
each clone's history): each trainable weight's change since the fine-tune
started and AdamW's two moments, all in bf16, gzipped. The start weights
need no saving: the rerun builds them again from the same start model and
seed (their digest is saved and checked). bf16 keeps 8 significant bits, so
a resumed run is not bit-identical to one that never stopped: its weights
move by a rounding of the change so far (about 0.4% of it at most) and the
moments by 0.4%, and its later losses differ in the third or fourth digit
(tests/training/test_step_checkpoint.py measures it). The step plan is a
pure function of the data, the knobs and the seed and no step draws random
numbers (no dropout), so nothing else differs.

The folder holds that state file and ``progress.json`` (steps done, their
losses, the key of the inputs, the start weights' digest, whether only an
adapter trains: a run banks only those, and the segments: which steps ran on
which machine in which precision, since a run resumed elsewhere may mix them
and its record must say so); it is replaced whole (write beside, then
rename), so a kill mid-save leaves the previous checkpoint. A checkpoint of
other inputs (start model, data, knobs, seed, adapter settings) is never
resumed: it is dropped with a warning and the fine-tune starts over. One
saved before this format (``trainable.safetensors`` and ``optimizer.pt``, in
fp32) is still resumed, exactly.
"""
from __future__ import annotations

import gzip
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
STATE = "state.safetensors.gz"
TRAINABLE = "trainable.safetensors"   # the fp32 format before STATE: still resumed
OPTIMIZER = "optimizer.pt"
MOMENTS = ("exp_avg", "exp_avg_sq")


def trainable(model: Any) -> list[tuple[str, Any]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def digest(tensors: dict) -> str:
    """Of named CPU tensors' bytes: the start weights a compact checkpoint's changes are added to."""
    import torch

    sha = hashlib.sha256()
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


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
        self.start: dict = {}   # the trainable weights before the first step, on the CPU

    def segments(self, step: int) -> list[dict]:
        """Which steps ran where, up to ``step``: one entry per process that
        ran some, earliest first."""
        mine = [{"from_step": self.resumed_from, "to_step": step, **self.here}] if step > self.resumed_from else []
        return self.earlier + mine

    def resume(self, model: Any, opt: Any) -> tuple[int, list[float]]:
        """(steps done, their losses), with the model's trainable weights and
        the optimizer's state loaded; (0, []) when there is nothing to resume.
        Called before the first step: the model's weights then are the start
        weights every later save's changes are taken from."""
        self.start = {n: p.detach().to("cpu", copy=True) for n, p in trainable(model)}
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
            if (self.folder / STATE).exists():
                if done.get("start_sha256") != digest(self.start):
                    log.warning("%s was saved from other start weights (the adapter's initialisation differs "
                                "here): starting over", self.folder)
                    self.remove()
                    return 0, []
                self._load_compact(model, opt)
            else:
                self._load_fp32(model, opt)
        except (OSError, ValueError, RuntimeError, KeyError, EOFError) as exc:
            log.warning("%s is unreadable (%s): starting over", self.folder, exc)
            self.remove()
            return 0, []
        log.info("resuming %s at step %d", self.folder.parent, done["step"])
        self.resumed_from = int(done["step"])
        # a checkpoint saved before segments were recorded: its steps ran somewhere unrecorded
        self.earlier = list(done.get("segments") or [{"from_step": 0, "to_step": self.resumed_from}])
        return self.resumed_from, list(done["losses"])

    def _load_compact(self, model: Any, opt: Any) -> None:
        import torch
        from safetensors.torch import load

        saved = load(gzip.decompress((self.folder / STATE).read_bytes()))
        with torch.no_grad():
            for name, param in trainable(model):
                param.copy_(self.start[name] + saved[f"change/{name}"].float())
                if f"step/{name}" in saved:
                    opt.state[param] = {"step": saved[f"step/{name}"].clone(),
                                        **{m: saved[f"{m}/{name}"].to(param.device, torch.float32) for m in MOMENTS}}

    def _load_fp32(self, model: Any, opt: Any) -> None:
        import torch
        from safetensors.torch import load_file

        weights = load_file(str(self.folder / TRAINABLE))
        state = torch.load(self.folder / OPTIMIZER, weights_only=True)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)
        opt.load_state_dict(state)

    def maybe_save(self, step: int, losses: list[float], model: Any, opt: Any, last: bool = False) -> None:
        """Save unless one was saved less than ``every_s`` ago; never after
        the last step (the finished model replaces the checkpoint)."""
        if last or time.monotonic() - self.saved_at < self.every_s:
            return
        self.save(step, losses, model, opt)

    def save(self, step: int, losses: list[float], model: Any, opt: Any) -> None:
        import torch
        from safetensors.torch import save

        tensors = {}
        for name, param in trainable(model):
            tensors[f"change/{name}"] = (param.detach().cpu() - self.start[name]).to(torch.bfloat16)
            state = opt.state.get(param)
            if state:
                tensors[f"step/{name}"] = torch.as_tensor(state["step"], dtype=torch.float32).cpu()
                tensors.update({f"{m}/{name}": state[m].detach().cpu().to(torch.bfloat16) for m in MOMENTS})
        part = self.folder.with_name(self.folder.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        (part / STATE).write_bytes(gzip.compress(save(tensors), compresslevel=6, mtime=0))
        atomic_write_json(part / PROGRESS, {"key": self.key, "step": step, "adapter": self.adapter, "losses": losses,
                                                "start_sha256": digest(self.start), "segments": self.segments(step)})
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
