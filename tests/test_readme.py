"""The README works as written: its step-by-step block runs in order on the
bundled model (small settings swapped in, nothing else changed), each step
reading what the step before wrote; and its prose stays readable (no
paragraph over 120 words)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.env_fixtures import ROOT, free_port

README = (ROOT / "README.md").read_text(encoding="utf-8")
TRAIN_SUPPORT = ROOT / "tests" / "training" / "support"
CPU_CONFIG = ROOT / "tests" / "training" / "cpu_config.py"
MAX_WORDS = 120
READING = "reading the trees in "


def paragraphs(text: str) -> list[str]:
    """The README's prose paragraphs: code blocks, tables, headings and list items left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip()]
        if lines and not any(line.lstrip().startswith(("|", "#", "![")) for line in lines[:1]):
            out.append(" ".join(lines))
    return out


def test_no_readme_paragraph_runs_over_120_words():
    long = [(len(p.split()), p[:80]) for p in paragraphs(README) if len(p.split()) > MAX_WORDS]
    assert not long, long


def test_paragraphs_are_found_and_counted():
    """The counter sees a long paragraph and ignores code and tables (else the test above proves nothing)."""
    sample = "intro words here\n\n" + "word " * 130 + "\n\n```bash\n" + "x " * 200 + "\n```\n\n| a |\n|---|\n"
    got = paragraphs(sample)
    assert [len(p.split()) for p in got] == [3, 130]


def step_by_step_block() -> str:
    section = README[README.index("## The pipeline, step by step"):]
    return section[section.index("```bash\n") + len("```bash\n"):section.index("\n```", section.index("```bash"))]


# the small settings: the paper's sizes would take days; every other word of the block runs as written
SMALL = [("mcts_collection.py --concurrency 16", "mcts_collection.py --min 0 --max 6 --concurrency 16"), ("MAX_DEPTH=20 ITERA=8 N_GEN=4", "MAX_DEPTH=6 ITERA=2 N_GEN=3"),
         ("NPROC_PER_NODE=8", "NPROC_PER_NODE=1"), ("--port 36001", "--port {port}")]


def test_the_step_by_step_block_runs_in_order_on_the_bundled_model(tmp_path):
    block = step_by_step_block()
    assert "export TASK=textcraft MODEL_DIR=/models/Llama-3.1-8B-Instruct" in block
    for old, _ in SMALL:
        assert old in block, f"the README's block no longer holds {old!r}: update SMALL"
    if not (ROOT / ".venv-train" / "bin" / "python").exists():
        pytest.skip("the training environment .venv-train is missing: run `make setup-train` (make test does)")
    port = free_port()
    script = block.replace("/models/Llama-3.1-8B-Instruct", str(tmp_path / "models" / "Llama-3.1-8B-Instruct"))
    for old, new in SMALL:
        script = script.replace(old, new.format(port=port))
    # the evals: the first test tasks, a few turns; the scripts reach the test's server by its port
    script = script.replace("python eval.py\n", f"python eval.py --limit 3 --max_steps 4 "
                                                 f"--env_server_base http://127.0.0.1:{port}\n")
    script = script.replace("python mcts_collection.py", f"python mcts_collection.py --env_server_base "
                                                         f"http://127.0.0.1:{port}")
    work = tmp_path / "work"
    work.mkdir()
    for name in ("eval.py", "mcts_collection.py", "path_collection.py", "xtuner_config", ".venv", ".venv-train",
                 "agentenv_servers", "agent_r"):
        (work / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "models" / "textcraft-tiny", tmp_path / "models" / "Llama-3.1-8B-Instruct")
    # the server started in the background by the block, stopped when the script ends; wait until it answers
    script = script.replace(f"--port {port} &", f"--port {port} & SERVER=$!; trap 'kill $SERVER' EXIT\n"
                                                 f"for i in $(seq 120); do python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)\" "
                                                 "2>/dev/null && break; sleep 1; done")
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "TASK", "MODEL_NAME", "BACKEND",
                                                            "VIRTUAL_ENV", "PYTHONPATH")}
    # XTuner on a CPU: the training tests' shims (in the training step only) and config (DeepSpeed off), one epoch
    script = script.replace("(source .venv-train/bin/activate && ",
                            f"(source .venv-train/bin/activate && export PYTHONPATH={TRAIN_SUPPORT} && ")
    env.update(CONFIG=str(CPU_CONFIG), DEEPSPEED="none", EPOCHS="1",
               MAX_LENGTH="512", ACCUMULATIVE_COUNTS="1", SAVE_FP32="1", WARMUP_RATIO="0", MAP_NUM_PROC="1", PORT=str(free_port()),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", BACKEND="hf", LOGLEVEL="INFO")
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                         text=True, timeout=1400)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-5000:]}"

    # 0 and 1: the base's eval and trees, in the folders the block names
    base_eval = work / "test_result" / "textcraft" / "Llama-3.1-8B-Instruct_iter0"
    trees = work / "mcts_result" / "textcraft" / "Llama-3.1-8B-Instruct"
    assert (base_eval / "summary.json").exists() and list(trees.glob("search_results_*.json"))
    # 2: both path_collection.py runs read step 1's trees, and say so first
    said = [line for line in res.stdout.splitlines() if line.startswith(READING)]
    assert len(said) == 2 and all((work / line[len(READING):]).resolve() == trees.resolve() for line in said)
    samples = json.loads((work / "mcts_training_data" / "train.json").read_text())
    assert samples and all("messages" in s for s in samples)
    # 3: the fine-tune read train.json and wrote the model step 4 evaluates
    new_model = work / "models" / "llama-iter1"
    assert list(new_model.glob("*.safetensors"))
    # 4: the new model's eval, another model than the base's, and the comparison of both
    new_eval = work / "test_result" / "textcraft" / "llama-iter1_iter1"
    base_sha = json.loads((base_eval / "summary.json").read_text())["model_sha256"]
    new_sha = json.loads((new_eval / "summary.json").read_text())["model_sha256"]
    assert base_sha != new_sha
    assert "Llama-3.1-8B-Instruct_iter0" in res.stdout and "llama-iter1_iter1" in res.stdout


README_LINES, ANSWER_LINES = 300, 60   # the front door's budgets: detail goes to docs/ and the account
ACCOUNT_LINES = 400   # reproduction/README.md: what each run found; the journal goes in each run's NOTES.md


def section_lines(text: str, heading: str) -> int:
    """Lines of a ``## heading`` section, the heading included, up to the next ``## `` heading."""
    lines = text.splitlines()
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return end - start


def test_the_front_door_holds_its_size():
    assert len(README.splitlines()) <= README_LINES, "README.md is over its 300 lines: move detail to docs/"
    assert section_lines(README, "## Does it work?") <= ANSWER_LINES, \
        "'Does it work?' is over 60 lines: the answer first, tables for the detail, the rest in the account"
    account = (ROOT / "reproduction" / "README.md").read_text()
    assert len(account.splitlines()) <= ACCOUNT_LINES, \
        "reproduction/README.md is over its 400 lines: say what the runs found, move the journal to their NOTES.md"


def test_the_size_budgets_fail_one_line_past_them():
    """The counts above see a line added past a budget (else the test proves nothing)."""
    answer = "## Does it work?\n" + "line\n" * (ANSWER_LINES - 1) + "## Next\n"
    assert section_lines(answer, "## Does it work?") == ANSWER_LINES
    assert section_lines(answer.replace("## Next", "one more\n## Next"), "## Does it work?") == ANSWER_LINES + 1
    assert len(("x\n" * (README_LINES + 1)).splitlines()) > README_LINES
    assert len(("x\n" * (ACCOUNT_LINES + 1)).splitlines()) > ACCOUNT_LINES
