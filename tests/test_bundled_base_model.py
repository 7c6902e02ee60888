"""Regression guard for models/textcraft-base, the base model of the self-training
loop: it loads, it records the train tasks it was taught (a fixed third of the
train split covering every recipe depth, none a test task), its tokenizer
knows the revision thoughts as words, and the data scripts' ``--tasks`` flag
emits conversations for the chosen tasks only."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r.envs import get_env
from agent_r.revision import REVISION_THOUGHTS
from agentenv_servers.textcraft_env import load_recipe_book
from scripts.make_expert_data import base_part, select_tasks
from agent_r.settings import UsageError

ROOT = Path(__file__).resolve().parents[1]
BASE_MODEL = ROOT / "models" / "textcraft-base"


@pytest.fixture(scope="module")
def training_tasks() -> dict:
    return json.loads((BASE_MODEL / "training_tasks.json").read_text())


def goal_depth(idx: int) -> int:
    book = load_recipe_book()
    return book.depth(book.task(idx)[0])


def test_base_model_files_are_small_and_load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = {p.name for p in BASE_MODEL.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md",
            "training_tasks.json", "training_stats.json"} <= files
    assert sum(p.stat().st_size for p in BASE_MODEL.iterdir()) <= 16 * 2**20
    config = json.loads((BASE_MODEL / "config.json").read_text())
    assert config["model_type"] == "llama" and config["head_dim"] == 64
    model = AutoModelForCausalLM.from_pretrained(BASE_MODEL)
    tok = AutoTokenizer.from_pretrained(BASE_MODEL)
    assert model.config.vocab_size == len(tok)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|begin_of_text|>")


def test_training_tasks_are_the_base_third_of_the_train_split(training_tasks):
    env = get_env("textcraft")
    train, test = set(env.split_indices("train")), set(env.split_indices("test"))
    assert training_tasks["task"] == "textcraft" and training_tasks["split"] == "train"
    for kind in ("policy", "verifier"):
        tasks = training_tasks[kind]
        assert tasks == sorted(set(tasks)) and all(isinstance(i, int) for i in tasks)
        assert set(tasks) <= train and not set(tasks) & test
        assert tasks == base_part()       # the documented deterministic choice, nothing else
        assert {goal_depth(i) for i in tasks} == {goal_depth(i) for i in train}
    assert len(training_tasks["policy"]) == len(train) // 3 + (len(train) % 3 > 0)


def test_base_part_is_deterministic_and_leaves_two_thirds_unseen():
    part = base_part()
    assert part == base_part()
    train = get_env("textcraft").split_indices("train")
    assert len(set(train) - set(part)) >= 2 * len(train) // 3


def test_tokenizer_knows_revision_thoughts_as_words():
    """A revision thought costs about a token per word, as in a real LLM's
    tokenizer (the game-only tokenizer of textcraft-tiny splits it far more)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BASE_MODEL)
    old = AutoTokenizer.from_pretrained(ROOT / "models" / "textcraft-tiny")
    texts = [f"Thought: {t}" for t in REVISION_THOUGHTS]
    words = statistics.mean(len(t.split()) for t in texts)
    new_tokens = statistics.mean(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    old_tokens = statistics.mean(len(old(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert new_tokens <= 1.6 * words < old_tokens


def test_a_task_file_with_a_test_task_is_refused(tmp_path):
    test_idx = get_env("textcraft").split_indices("test")[0]
    bad = tmp_path / "tasks.json"
    bad.write_text(json.dumps({"task": "textcraft", "split": "train", "policy": [test_idx], "verifier": []}))
    with pytest.raises(UsageError, match="not train tasks"):
        select_tasks(str(bad), "policy")


def _run(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _tasks_of(path: Path) -> list[int]:
    return sorted({int(json.loads(line)["task_num"]) for line in path.read_text().splitlines()})


def test_data_scripts_emit_only_the_chosen_tasks(tmp_path, training_tasks):
    policy, verifier = tmp_path / "policy.jsonl", tmp_path / "verifier.jsonl"
    _run("scripts.make_expert_data", "--tasks", "base", "--limit", "4", "--variants", "1", "--renamed", "1",
         "--out", str(policy))
    _run("scripts.make_verifier_data", "--tasks", str(BASE_MODEL / "training_tasks.json"), "--limit", "3",
         "--out", str(verifier))
    assert _tasks_of(policy) == training_tasks["policy"][:4]
    assert _tasks_of(verifier) == training_tasks["verifier"][:3]
    # never a revision turn inside a trajectory: the policy rows hold expert turns only
    text = policy.read_text()
    assert not any(t in text for t in REVISION_THOUGHTS) and "Action: wait" not in text


def test_trainer_shows_the_method_text_to_the_tokenizer_and_records_the_tasks():
    from scripts.train_tiny_model import method_texts, training_tasks

    texts = method_texts()
    for thought in REVISION_THOUGHTS:
        assert sum(f"Thought: {thought}\nAction: wait" in t for t in texts) == 1
    assert any("Judgment: <Good|Bad|Uncertain>" in t for t in texts)
    policy = [{"task_num": "7"}, {"task_num": "3"}, {"task_num": "7"}]
    assert training_tasks(policy, [{"task_num": "3"}]) == {"task": "textcraft", "split": "train",
                                                          "policy": [3, 7], "verifier": [3]}


def test_a_tokenizer_that_merges_across_the_generation_prompt_is_refused():
    """A blank line before a line break in the tokenizer's corpus teaches it a
    "\\n\\n" token; the generation prompt would then end in a token no training
    turn follows, and the model starts every turn from an unseen context."""
    from scripts.train_tiny_model import check_generation_prompt, method_texts, render, train_tokenizer

    convo = render([{"role": "user", "content": "Goal: craft stick."},
                    {"role": "assistant", "content": "Thought: I can craft stick now.\nAction: craft 1 stick"}])[0]
    check_generation_prompt(train_tokenizer([convo] * 5 + method_texts() * 20, 400))
    with pytest.raises(UsageError, match="generation prompt"):
        check_generation_prompt(train_tokenizer([convo] * 5 + ["Action: \n\n\nObservation: \n\n\n"] * 50, 400))
