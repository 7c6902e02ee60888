"""The policy double of the cluster tests: tests/loop/doubles.py's
``weights_double`` (per-request deterministic: a shard's samples do not
depend on its batch-mates), with a gate. While the folder CLUSTER_GATE holds
a file ``hold``, the array task CLUSTER_HOLD_TASK stops at its 12th model
call (a tree or two into its shard), writes ``reached`` there and waits
until SLURM cancels it: a run held at a known point, not raced by a clock."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agent_r.llm import GenerationRequest, SamplingConfig
from tests.loop.doubles import WeightsDouble

DOUBLE = "python:tests.cluster.doubles:gated_double"
HOLD_AT_CALL = 12


class GatedDouble(WeightsDouble):
    name = "gated-double"

    def __init__(self, model_dir: str):
        super().__init__(model_dir)
        self.calls = 0

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        gate = os.environ.get("CLUSTER_GATE")
        if gate and os.environ.get("SLURM_ARRAY_TASK_ID") == os.environ.get("CLUSTER_HOLD_TASK") \
                and (Path(gate) / "hold").exists():
            self.calls += 1
            if self.calls >= HOLD_AT_CALL:
                (Path(gate) / "reached").write_text(str(os.getpid()))
                while True:      # held until scancel's SIGTERM
                    time.sleep(0.05)
        return super().generate(requests, sampling)


def gated_double(model_dir: str, **options: Any) -> GatedDouble:
    return GatedDouble(model_dir)
