"""path_collection.py never writes over rows made from other trees: the
step-by-step pipeline's second iteration (MODEL_DIR the fine-tuned model,
its trees in their own folder) would otherwise replace the first
iteration's mcts_training_data/textcraft_good.jsonl without a word. It
refuses in one line naming both tree folders and the way out; the same
trees again resume as before."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import tree_fixtures as tf

ROOT = Path(__file__).resolve().parents[2]


def collect(cwd: Path, model: str, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "INPUT_DIR", "OUTPUT_DIR")}
    env.update(TASK="textcraft", MODEL_NAME=model, PYTHONPATH=str(ROOT), LOGLEVEL="WARNING")
    return subprocess.run([sys.executable, str(ROOT / "path_collection.py"), "--data_type", "good", *flags],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_rows_of_another_models_trees_are_not_overwritten(tmp_path):
    for model, trees in (("llama-base", (tf.tree_many_leaves(), tf.tree_shared_prefix())),
                         ("llama-iter1", (tf.tree_split_at_root(),))):
        for idx, tree in enumerate(trees):
            tf.write_tree(tree, tmp_path / "mcts_result" / "textcraft" / model, idx)
    rows = tmp_path / "mcts_training_data" / "textcraft_good.jsonl"

    first = collect(tmp_path, "llama-base")
    assert first.returncode == 0, first.stderr[-2000:]
    before = rows.read_bytes()
    assert before.count(b"\n") >= 2

    second = collect(tmp_path, "llama-iter1")
    assert second.returncode == 2
    line = second.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "mcts_result/textcraft/llama-base" in line and "mcts_result/textcraft/llama-iter1" in line
    assert "--output_dir" in line
    assert rows.read_bytes() == before                      # the first iteration's rows are intact

    beside = collect(tmp_path, "llama-iter1", "--output_dir", "mcts_training_data/llama-iter1")
    assert beside.returncode == 0, beside.stderr[-2000:]
    assert (tmp_path / "mcts_training_data" / "llama-iter1" / "textcraft_good.jsonl").read_bytes().count(b"\n") >= 1
    again = collect(tmp_path, "llama-base")                 # the same trees: a rerun, as before
    assert again.returncode == 0 and rows.read_bytes() == before
