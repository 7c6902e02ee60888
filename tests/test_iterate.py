"""iterate.py: the self-training loop end to end (search, revision data,
export, fine-tuning, eval) on the real local TextCraft (and SciWorld) servers
with a tiny random Llama that really is fine-tuned and saved each iteration;
resume after a kill; one-line errors; and the CPU trainer's label masks equal
XTuner's on the same samples.

The policy is a test double (``weights_double`` below): a random tiny model
finds no successes, so its moves come from the seeded TextCraft double, with
the seed mixed with a hash of the model's weights. So every model the loop
trains plays differently, and equal results mean equal models.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import iterate as iterate_script
from agent_r import cpu_trainer
from agent_r.iterate import IterateSettings, run
from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig, derive_seed
from agent_r.settings import parse, run_cli
from tests.support.doubles import ScriptedBackend
from tests.support.model_fixtures import build_tiny_model
from tests.support.search_doubles import seeded_textcraft_policy

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = "python:tests.test_iterate:weights_double"
GATE = "ITERATE_TEST_GATE"   # a folder: the double blocks inside iteration 2's search (see below)


# --------------------------------------------------------------------------- the policy double

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


# --------------------------------------------------------------------------- settings

SMALL = dict(ITERA="3", N_GEN="3", MAX_DEPTH="4", TEMP="1.0", ITERATIONS="2", VARIANTS="agent-r,direct,good",
             EPOCHS="1", LR="1e-3", ACCUMULATIVE_COUNTS="1", WARMUP_RATIO="0", MAX_LENGTH="1024",
             TRAINER="cpu", BACKEND=DOUBLE)
FLAGS = ["--min", "1", "--max", "5", "--eval_limit", "3", "--eval_max_steps", "4", "--revise_limit", "2",
         "--max_new_tokens", "40", "--concurrency", "2", "--max_pairs_per_tree", "3"]


def settings_for(env: dict[str, str], flags: list[str]) -> IterateSettings:
    return parse(IterateSettings, flags, environ=env)


def comparable(rows: list[dict]) -> list[dict]:
    """Rows without wall times."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("iterate_base") / "model", seed=3)


@pytest.fixture(scope="module")
def small_env(base_model, textcraft_server) -> dict[str, str]:
    return {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model}


@pytest.fixture(scope="module")
def undisturbed(small_env, textcraft_server, tmp_path_factory) -> Path:
    """Two iterations of all three variants, run in-process through the library."""
    runs = tmp_path_factory.mktemp("runs")
    result = run(settings_for(small_env, FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(runs),
                                                  "--name", "plain"]))
    assert result.exit_code == 0, result.incomplete
    return result.root


# --------------------------------------------------------------------------- the loop

def test_two_iterations_end_to_end(undisturbed):
    results = json.loads((undisturbed / "results.json").read_text())
    rows = results["rows"]
    assert [(r["iteration"], r["variant"]) for r in rows] == [
        (0, "base"), (1, "agent-r"), (1, "direct"), (1, "good"), (2, "agent-r"), (2, "direct"), (2, "good")]
    assert (undisturbed / "results.png").stat().st_size > 1000
    md = (undisturbed / "results.md").read_text()
    assert "| 2 | agent-r |" in md and "textcraft success %" in md
    # iteration 1 of every variant starts from the base model's one search
    assert sorted(p.name for p in (undisturbed / "iter_1" / "trees").iterdir()) == ["base"]
    assert sorted(p.name for p in (undisturbed / "iter_2" / "trees").iterdir()) == ["agent-r", "direct", "good"]
    by = {(r["iteration"], r["variant"]): r for r in rows}
    for v in ("agent-r", "direct", "good"):
        one, two = by[(1, v)], by[(2, v)]
        assert one["model"] == f"iter_1/model/{v}/hf" and two["started_from"] == one["model"]
        assert one["train"]["trainer"] == "cpu" and one["train"]["steps"] > 0
        assert one["test"]["textcraft"]["tasks"] == 3 and one["revise_task"]["textcraft"]["tasks"] >= 1
        assert one["search"]["textcraft"]["trees"] == 4   # train tasks 1-4 (5 is a test task)
    data = {v: by[(1, v)]["data"]["tasks"]["textcraft"] for v in ("agent-r", "direct", "good")}
    assert data["agent-r"]["revision_samples"] > 0 and data["good"]["revision_samples"] == 0
    assert data["agent-r"]["good_samples"] == data["good"]["good_samples"] > 0   # same trees
    assert data["agent-r"]["mean_first_bad_step"] is not None and data["direct"]["mean_first_bad_step"] is None
    assert by[(1, "good")]["data"]["train_samples"] == data["good"]["good_samples"]
    # the trained model is a Hugging Face directory the hf backend loads and runs
    backend = HFBackend(str(undisturbed / "iter_2" / "model" / "agent-r" / "hf"), device="cpu")
    try:
        msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Goal: craft stick."}]
        out = backend.generate([GenerationRequest(msgs, n=1)], SamplingConfig(temperature=0.0, max_new_tokens=8))
        assert len(out) == 1 and isinstance(out[0][0], str)
    finally:
        backend.close()


def _cli(env: dict[str, str], args: list[str]) -> subprocess.Popen:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "OMP_NUM_THREADS", "TMPDIR")}
    return subprocess.Popen([sys.executable, str(ROOT / "iterate.py"), *args], cwd=ROOT,
                            env={**keep, "PYTHONPATH": str(ROOT), "LOGLEVEL": "WARNING", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_run_killed_mid_stage_and_rerun_equals_the_undisturbed_run(undisturbed, small_env, textcraft_server,
                                                                      tmp_path):
    args = FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(tmp_path), "--name", "killed"]
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = _cli({**small_env, GATE: str(gate)}, args)
    try:
        deadline = time.monotonic() + 600
        while not (gate / "reached").exists():   # the double holds the run inside iteration 2's search
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never reached the gate"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    root = tmp_path / "killed"
    assert not (root / "iter_2" / "trees" / "agent-r" / ".done.json").exists()
    assert list((root / "iter_2" / "trees" / "agent-r").glob("*/*/search_results_*.json"))  # some trees kept
    finished = {p: p.stat().st_mtime_ns for p in (root / "iter_1").rglob(".done.json")}
    out, err = _cli(small_env, args).communicate(timeout=900)
    assert "results:" in out, err[-3000:]
    assert {p: p.stat().st_mtime_ns for p in finished} == finished   # finished stages were not redone
    got = json.loads((root / "results.json").read_text())["rows"]
    want = json.loads((undisturbed / "results.json").read_text())["rows"]
    assert comparable(got) == comparable(want)


def test_multi_task_pools_data_trains_one_model_and_scores_each_task(base_model, textcraft_server, sciworld_server,
                                                                      tmp_path):
    env = {**SMALL, "TASK": "textcraft,sciworld", "MODEL_DIR": base_model, "ITERATIONS": "1",
           "VARIANTS": "agent-r", "MAX_DEPTH": "3"}
    s = settings_for(env, FLAGS + ["--env_server_base", f"{textcraft_server},{sciworld_server}", "--runs_dir",
                                   str(tmp_path), "--name", "multi", "--max", "3", "--task_iteration", "1",
                                   "--eval_limit", "2", "--eval_max_steps", "2", "--revise_limit", "1"])
    result = run(s)
    assert result.exit_code == 0, result.incomplete
    rows = result.rows
    assert [r["variant"] for r in rows] == ["base", "agent-r"]
    for r in rows:
        assert set(r["test"]) == {"textcraft", "sciworld"} and r["test"]["sciworld"]["tasks"] == 2
    one = rows[1]
    assert set(one["search"]) == {"textcraft", "sciworld"} and one["search"]["sciworld"]["trees"] >= 1
    assert one["data"]["train_samples"] >= one["data"]["tasks"]["textcraft"]["revision_samples"] > 0
    assert list((tmp_path / "multi" / "iter_1" / "model").iterdir()) == [tmp_path / "multi" / "iter_1" / "model" / "agent-r"]
    header = result.table.splitlines()[4]
    assert "textcraft success %" in header and "sciworld success %" in header and "average" in header


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("env, flags, says", [
    ({"VARIANTS": "agent-r,star"}, [], "unknown variant 'star'"),
    ({"TRAINER": "xtuner", "TRAIN_VENV": "/nonexistent/venv"}, [], "training environment /nonexistent/venv is missing"),
    ({"MODEL_DIR": "/nonexistent/model"}, [], "MODEL_DIR='/nonexistent/model' does not exist"),
    ({"TASK": "minecraft"}, [], "minecraft"),
    ({"TASK": "textcraft,sciworld"}, ["--split_file", "tasks.json"], "--split_file lists the tasks of one"),
], ids=["variant", "trainer_env", "model_dir", "task", "split_file_multi_task"])
def test_bad_input_gets_one_clear_line(env, flags, says, base_model, tmp_path, capsys, monkeypatch):
    for name in ("TASK", "VARIANTS", "TRAINER", "TRAIN_VENV", "MODEL_DIR", "BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL_DIR", base_model)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: iterate_script.main(flags + ["--runs_dir", str(tmp_path), "--env_server_base",
                                                     "http://127.0.0.1:9"]))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert not list(tmp_path.iterdir())   # nothing was started


# --------------------------------------------------------------------------- the CPU trainer vs XTuner

def _samples() -> list[dict]:
    """Export-shaped samples: a bad prefix without loss, several user messages
    in a row, a sample over MAX_LENGTH, one with nothing to train."""
    head = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Crafting commands:\ncraft 4 stick using 2 oak planks"},
            {"role": "assistant", "content": "Ok.", "loss": False},
            {"role": "user", "content": "Goal: craft stick."}]
    turn = lambda a, loss: {"role": "assistant", "content": f"Thought: t\nAction: {a}", "loss": loss}  # noqa: E731
    obs = lambda o: {"role": "user", "content": o}  # noqa: E731
    return [
        {"messages": head + [turn("get 2 oak planks", True), obs("Got 2 oak planks"), turn("inventory", True)]},
        {"messages": head + [turn("craft 1 stick", False), obs("Could not execute"), turn("wait", True), obs("ok."),
                             turn("get 2 oak planks", True), obs("Got 2 oak planks")]},
        {"messages": head + [obs("and again"), turn("inventory", True)]},
        {"messages": head + [turn("inventory", True), obs("Inventory: " + "[oak planks] (2) " * 80),
                             turn("craft 4 stick using 2 oak planks", True)]},
        {"messages": head + [turn("inventory", False), obs("nothing")]},
    ]


def test_cpu_trainer_labels_equal_xtuners_openai_map_fn_and_template(tmp_path, tiny_model_dir):
    from tests.train.conftest import TRAIN_VENV, run_train_env
    from transformers import AutoTokenizer

    data = tmp_path / "train.json"
    data.write_text(json.dumps(_samples()))
    script = ("import json, sys\nfrom mmengine.config import Config\nfrom xtuner.registry import BUILDER\n"
              "cfg = Config.fromfile(sys.argv[1])\n"
              "print(json.dumps([{'ids': s['input_ids'], 'labels': s['labels']} "
              "for s in BUILDER.build(cfg.train_dataloader.dataset)]))\n")
    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-c", script,
                       str(ROOT / "xtuner_config" / "agent_r_llama3_8b_full.py")],
                      MODEL_DIR=tiny_model_dir, DATA_FILES=data, PACK=0, MAX_LENGTH=256)
    xtuner = json.loads(r.stdout.strip().splitlines()[-1])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = [{"ids": e.ids, "labels": e.labels} for e in cpu_trainer.examples(_samples(), tok, 256)]
    assert len(ours) == len(xtuner) == 4   # the sample with nothing to train is dropped by both
    assert ours == xtuner
    assert len(ours[3]["ids"]) == 256      # cut at MAX_LENGTH
    trained = [tok.decode([i for i, y in zip(s["ids"], s["labels"]) if y != -100]) for s in ours[:2]]
    assert "craft 1 stick" not in trained[1] and "Action: wait<|eot_id|>" in trained[1]
    assert "Ok." not in trained[0] and trained[0].count("<|eot_id|>") == 2


def test_xtuner_trainer_runs_train_sh_in_the_training_env(tmp_path, tiny_model_dir, monkeypatch):
    """TRAINER=xtuner: xtuner_config/train.sh in .venv-train, as on a cluster
    (here with the tests' CPU config and shims, passed the way a user would)."""
    from agent_r.iterate import train_stage, ModelPool
    from tests.train.conftest import CPU_CONFIG, SUPPORT, TRAIN_VENV

    data = tmp_path / "train.json"
    data.write_text(json.dumps(_samples()[:2] * 4))
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
    monkeypatch.setenv("MAP_NUM_PROC", "1")
    monkeypatch.setenv("PACK", "0")   # one sample per step: 24 steps, losses logged at 10 and 20
    s = parse(IterateSettings, [], environ={"TRAINER": "xtuner", "TRAIN_VENV": str(TRAIN_VENV),
                                            "CONFIG": str(CPU_CONFIG), "DEEPSPEED": "none", "EPOCHS": "3",
                                            "LR": "1e-3", "ACCUMULATIVE_COUNTS": "1", "WARMUP_RATIO": "0",
                                            "MAX_LENGTH": "512", "MODEL_DIR": tiny_model_dir})
    stats = train_stage(s, ModelPool(0, 512), "xtuner", tiny_model_dir, [str(data)], tmp_path / "model")
    assert stats["trainer"] == "xtuner" and stats["steps"] == 24 and stats["last_loss"] < stats["first_loss"]
    hf = tmp_path / "model" / "hf"
    assert (hf / "config.json").exists() and list(hf.glob("*.safetensors"))
    assert "next iteration: export MODEL_DIR=" in (tmp_path / "model" / "train.log").read_text()


def test_cpu_trainer_prefix_cache_gives_the_plain_loss(tiny_model_dir):
    """A batch's shared prefix runs once; the summed token loss equals each
    sample's own full forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = cpu_trainer.examples(_samples()[:3], tok, 512)
    assert cpu_trainer.common_prefix(batch) > 10
    got, tokens = cpu_trainer.batch_loss(model, batch, tok.pad_token_id)
    want, n = 0.0, 0
    for ex in batch:
        k = sum(1 for y in ex.labels[1:] if y != -100)
        out = model(input_ids=torch.tensor([ex.ids]), labels=torch.tensor([ex.labels]))
        want, n = want + out.loss.item() * k, n + k
    assert tokens == n and abs(got.item() - want) < 1e-3 * want


def test_split_file_reaches_the_search_and_the_guard_still_holds(tmp_path, textcraft_server):
    """--split_file chooses the searched tasks (spread over the split rather
    than its first indices); a test task listed in it is still dropped."""
    from agent_r import iterate as loop
    from agent_r.envs import get_env

    spec = get_env("textcraft")
    train, test = spec.split_indices("train"), spec.split_indices("test")
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps([{"item_id": f"textcraft_{i}"} for i in (train[0], test[0], train[-1])]))
    settings = parse(IterateSettings, ["--split_file", str(split), "--env_server_base", textcraft_server], {})
    ss = loop.search_settings(settings, "textcraft", tmp_path / "trees", loop.Policy("m", "m", settings.backend))
    assert ss.split_file == str(split)
    assert spec.search_indices(ss, textcraft_server)[0] == [train[0], train[-1]]


def test_reproduce_full_shards_write_the_folder_the_loop_reads(tmp_path, textcraft_server):
    """bench/reproduce_full.sh searches iteration 1 with mcts_collection.py
    shards beside the base eval. Were their folder not the one iterate.py's
    search stage reads (it names a model's folders by its label), each
    variant would silently search every tree again: the first run of that
    script did, until the shards got ``--model_name base``."""
    import shlex
    from agent_r import iterate as loop
    from agent_r.search import SearchSettings

    script = (ROOT / "bench" / "reproduce_full.sh").read_text()
    command = script[script.index('"$PY" mcts_collection.py'):]
    command = command[:command.index(" > ")].replace("\\\n", " ")
    split = tmp_path / "tasks.json"
    split.write_text(json.dumps([{"item_id": "textcraft_1"}]))
    for var, value in {"$RUNS/$NAME": str(tmp_path / "run"), "$URL": textcraft_server, "$SPLIT": str(split),
                       "$SHARDS": "2", "$i": "0"}.items():
        command = command.replace(var, value)
    env = {"TASK": "textcraft"}
    shard = parse(SearchSettings, shlex.split(command)[2:], env)

    settings = parse(IterateSettings, ["--env_server_base", textcraft_server, "--split_file", str(split)], env)
    base = loop.policy(settings, loop.BASE, shard.backend.model_dir)
    read = loop.search_settings(settings, "textcraft", loop.Layout(tmp_path / "run").trees(1, loop.BASE), base)
    assert shard.out_dir() == read.out_dir()
    assert shard.shard.num_shards == 2
