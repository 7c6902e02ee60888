"""The policy double of the loop tests: a random tiny model finds no
successes, so ``weights_double`` plays the seeded TextCraft double with the
seed mixed with a hash of the model's weights. So every model the loop trains
plays differently, and equal results mean equal models."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from agent_r.llm import GenerationRequest, SamplingConfig, derive_seed
from tests.support.doubles import ScriptedBackend
from tests.support.search_doubles import seeded_textcraft_policy

DOUBLE = "python:tests.loop.doubles:weights_double"
GATE = "ITERATE_TEST_GATE"   # a folder: the double blocks inside iteration 2's search (see WeightsDouble)


def weights_digest(model_dir: str) -> str:
    h = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class WeightsDouble(ScriptedBackend):
    """Test double. TextCraft turns: the seeded TextCraft double, seeded by the
    request seed and the weights; verifier prompts: Bad for about a third of
    the steps; anything else (SciWorld): ``look around``. With the GATE folder
    set, agent-r's model_1 blocks in its first search call after a tree of
    iteration 2 is written (``reached`` appears in the folder) until the test
    kills the process."""

    name = "weights-double"

    def __init__(self, model_dir: str):
        self.digest, self.model_dir = weights_digest(model_dir), model_dir
        super().__init__(self.turn)

    def turn(self, messages: list[dict], index: int, seed: int | None) -> str:
        last = messages[-1]["content"]
        if "Judgment: <Good|Bad|Uncertain>" in last:
            bad = int(hashlib.sha256(f"{self.digest}/{last}".encode()).hexdigest(), 16) % 3 == 0
            return f"I checked the step.\nJudgment: {'Bad' if bad else 'Good'}"
        if "Crafting commands:" in messages[3]["content"]:
            return seeded_textcraft_policy(messages, index, derive_seed(seed, self.digest))
        return "Thought: I look first.\nAction: look around"

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[list[str]]:
        gate = os.environ.get(GATE)
        if gate and any(r.n > 1 for r in requests) and self.search_written():
            (Path(gate) / "reached").write_text(self.model_dir)
            while True:          # held here until killed: the gate, not a clock
                time.sleep(0.05)
        return super().generate(requests, sampling)

    def search_written(self) -> bool:
        """True once model_1 of agent-r (runs/<name>/iter_1/model/agent-r/hf)
        has written a tree of iteration 2's search."""
        model = Path(self.model_dir)
        if model.parts[-4:] != ("iter_1", "model", "agent-r", "hf"):
            return False
        return any((model.parents[3] / "iter_2" / "trees" / "agent-r").glob("*/*/search_results_*.json"))


def weights_double(model_dir: str, **options: Any) -> WeightsDouble:
    return WeightsDouble(model_dir)


class WaitDouble(ScriptedBackend):
    """Test double for WAIT_REPLY: in every episode its second turn is a
    revision turn as training samples write it (a revision thought, then
    ``wait``); every other turn checks the inventory."""

    name = "wait-double"

    def __init__(self) -> None:
        super().__init__(self.turn)

    @staticmethod
    def turn(messages: list[dict], index: int, seed: int | None) -> str:
        from agent_r.conversation import HEAD_LEN
        from agent_r.revision import REVISION_THOUGHTS

        k = sum(1 for m in messages[HEAD_LEN:] if m["role"] == "assistant")
        return f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait" if k == 1 else "Thought: look.\nAction: inventory"


def wait_double(model_dir: str, **options: Any) -> WaitDouble:
    return WaitDouble()
