"""The shipped model as its own critic: through the real path_collection.py
(subprocess, hf backend, the demo's prompt budget) it judges a known-good
step of a TRAIN task Good and a known-bad one Bad, so the revision row is cut
at the bad step. Greedy decoding: no timing, no sampling luck."""
import json
import os
import subprocess
import sys
from pathlib import Path

from agent_r.conversation import initial_conversation
from agent_r.envs import get_env
from agent_r.tree import Node
from agentenv_client import load_instruction
from agentenv_servers.textcraft_env import TextCraftGame
from scripts.make_verifier_data import ground_truth
from tests.support.tree_fixtures import add_step, backup, write_tree

ROOT = Path(__file__).resolve().parents[2]

# (train task, good first step, bad second step of the failed path, right second step)
JUDGED = (131, "get 1 oak logs", "craft 4 stick using 2 oak planks", "craft 4 oak planks using 1 oak logs")


def test_path_collection_with_the_shipped_model_cuts_at_the_known_bad_step(tmp_path):
    """Task 131: the shared first step is judged Good, the wrong second step Bad
    (no unparseable reply), so the one revision row is cut after step 2."""
    idx, first, bad, right = JUDGED
    assert idx in get_env("textcraft").split_indices("train")
    task = TextCraftGame(idx).observation
    root = Node(state=initial_conversation(load_instruction("textcraft"), task))
    obs_first, obs_bad, obs_right = _after(idx, [first]), _after(idx, [first, bad]), _after(idx, [first, right])
    shared = add_step(root, first, obs_first)
    assert ground_truth(task, first, obs_first)[0] == "Good" and ground_truth(task, bad, obs_bad)[0] == "Bad"
    add_step(shared, bad, obs_bad, score=0.0)
    add_step(shared, right, obs_right, score=1.0)
    trees = tmp_path / "trees"
    write_tree(backup(root), trees, idx)

    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "MODEL_NAME", "TEMP", "ALPHA", "BETA")}
    env.update(TASK="textcraft", BACKEND="hf", MAX_TOKEN_LENGTH="2048", LOGLEVEL="WARNING", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "path_collection.py", "--input_dir", str(trees), "--output_dir",
                           str(tmp_path / "out"), "--data_type", "centric", "--revise", "1", "--max_new_tokens", "100"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "unparseable judgements: 0" in proc.stdout and "first bad step (position:paths): 2:1" in proc.stdout
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "textcraft_centric.jsonl").read_text().splitlines()]
    feedback = row["revise_feedback"]
    assert [f["action"] for f in feedback] == [first, bad]
    assert [f["judgement"] for f in feedback] == ["Good", "Bad"], [f["revision_feedback"] for f in feedback]
    assert all(f["revision_feedback"].splitlines()[-1].startswith("Judgment: ") for f in feedback)


def _after(idx: int, actions: list[str]) -> str:
    """The game's observation after playing ``actions`` on task ``idx``."""
    game = TextCraftGame(idx)
    return [game.step(a)[0] for a in actions][-1]
