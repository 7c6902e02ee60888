"""Two CPU processes (``command_argv``: torchrun, DDP on gloo; accelerate's
CPU launcher needs MPI) train the tiny model with the same global batch as
one process: the same number of optimizer steps, one process writing the
outputs, and a Hugging Face folder that loads and generates."""
from __future__ import annotations

import json
import os
import subprocess

from agent_r.training import resume, trl_sft
from tests.support.model_fixtures import free_port
from tests.training_trl.conftest import ROOT, quick


def launch(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{argv} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


def test_two_cpu_processes_take_the_same_steps_as_one_and_save_a_loadable_model(trl_export, tiny_model_dir,
                                                                                  tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    n = len(json.loads(trl_export.read_text()))
    # global batch 4 both ways: 1 process x 2 samples x 2 accumulated, 2 processes x 1 sample x 2 accumulated
    one = quick(epochs=2, batch_size=2, accumulative_counts=2)
    two = quick(epochs=2, batch_size=1, accumulative_counts=2)
    r1 = launch(trl_sft.command_argv(tiny_model_dir, [str(trl_export)], str(tmp_path / "one"), one))
    r2 = launch(trl_sft.command_argv(tiny_model_dir, [str(trl_export)], str(tmp_path / "two"), two, processes=2,
                                     port=free_port()))
    s1 = json.loads((tmp_path / "one" / resume.DONE).read_text())
    s2 = json.loads((tmp_path / "two" / resume.DONE).read_text())
    assert (s1["processes"], s2["processes"]) == (1, 2)
    assert s1["global_batch"] == s2["global_batch"] == 4
    assert s1["steps"] == s2["steps"] == 2 * -(-n // 4)
    assert r2.stdout.count("next iteration: export MODEL_DIR=") == 1          # one process reports and writes
    assert "'loss'" not in r1.stdout + r2.stdout and "loss" in r1.stderr       # step logs go to stderr
    assert len(json.loads((tmp_path / "two" / resume.HISTORY).read_text())) == s2["steps"]

    hf = tmp_path / "two" / "hf"
    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed                                                             # trained, not a copy
    ids = tok("Goal: craft stick.", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]
