"""Search -> revision data -> XTuner export, all as subprocess scripts.

mcts_collection.py searches the real local TextCraft server with a search
policy double (expert step or a useless move, so trees have both successes and
failures); path_collection.py then verifies with the real tiny transformers
model (hf backend) - its junk replies are unparseable, so every step counts as
Uncertain and each low path is the bad prefix - and the XTuner export is
checked turn by turn against the bad prefix.
"""
import json
import os
import subprocess
import sys

from tests.support.env_fixtures import ROOT


CLEARED = ("TASK", "ALPHA", "BETA", "TEMP", "MODEL_DIR", "MODEL_NAME", "BACKEND", "MAX_TOKEN_LENGTH",
           "MAX_DEPTH", "ITERA", "N_GEN")


def script(name, *args, cwd, **env):
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update({k: str(v) for k, v in env.items()})
    r = subprocess.run([sys.executable, str(ROOT / name), *map(str, args)], cwd=cwd, env=full,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name} failed:\n{r.stdout}\n{r.stderr[-3000:]}"
    return r


def test_search_then_revision_then_xtuner_export(tmp_path, textcraft_server, tiny_model_dir):
    script("mcts_collection.py", "--env_server_base", textcraft_server, "--min", 0, "--max", 3,
           "--backend", "python:tests.support.tree_fixtures:expert_or_mistake_backend", cwd=tmp_path,
           TASK="textcraft", MODEL_NAME="expert-double", MAX_DEPTH=3, ITERA=4, N_GEN=2, PYTHONPATH=ROOT)
    trees = tmp_path / "mcts_result" / "textcraft" / "expert-double"
    assert (trees / "manifest.json").exists() and len(list(trees.glob("search_results_*.json"))) == 2

    r = script("path_collection.py", "--backend", "hf", "--max_new_tokens", 8, "--max_pairs_per_tree", 3, cwd=tmp_path,
               TASK="textcraft", MODEL_NAME="expert-double", MODEL_DIR=tiny_model_dir, PYTHONPATH=ROOT)
    rows = [json.loads(x) for x in (tmp_path / "mcts_training_data" / "textcraft_centric.jsonl").read_text().splitlines()]
    assert rows, r.stdout
    summary = r.stdout
    prompts = int(summary.split("verifier calls (prompts): ")[1].split()[0])
    unparseable = int(summary.split("unparseable judgements: ")[1].split()[0])
    assert 0 < prompts and unparseable <= prompts
    for row in rows:
        assert row["revise"] is True
        assert len(row["revise_feedback"]) >= 1
        assert all(f["judgement"] in ("Good", "Bad", "Uncertain") for f in row["revise_feedback"])

    data = (tmp_path / "mcts_training_data" / "textcraft_centric.jsonl").read_bytes()
    again = script("path_collection.py", "--backend", "hf", "--max_new_tokens", 8, "--max_pairs_per_tree", 3,
                   cwd=tmp_path, TASK="textcraft", MODEL_NAME="expert-double", MODEL_DIR=tiny_model_dir, PYTHONPATH=ROOT)
    assert f"({0} this run)" in again.stdout                      # every tree resumed, no model call
    assert (tmp_path / "mcts_training_data" / "textcraft_centric.jsonl").read_bytes() == data

    export = script("path_collection.py", "export", "--format", "xtuner", "--input",
                    "mcts_training_data/textcraft_centric.jsonl", "--output", "train.json", cwd=tmp_path)
    assert f"{len(rows)} revision" in export.stdout
    samples = json.loads((tmp_path / "train.json").read_text())
    assert len(samples) == len(rows)
    by_content = {json.dumps([(m["role"], m["content"]) for m in s["messages"]]): s for s in samples}
    for row in rows:
        sample = by_content[json.dumps([(m["role"], m["content"]) for m in row["revise_log"]])]
        msgs = sample["messages"]
        assistant = [m for m in msgs if m["role"] == "assistant"]
        assert all(isinstance(m["loss"], bool) for m in assistant)
        assert all("loss" not in m for m in msgs if m["role"] != "assistant")
        wait = next(i for i, m in enumerate(msgs) if m["role"] == "assistant" and m["content"].endswith("\nAction: wait"))
        bad_prefix = [m for m in row["low_log"][4:] if m["role"] == "assistant"][:len(row["revise_feedback"])]
        assert [m["content"] for m in msgs[4:wait] if m["role"] == "assistant"] == [m["content"] for m in bad_prefix]
        assert all(m["loss"] is False for m in msgs[:wait] if m["role"] == "assistant")   # "Ok." + bad prefix
        assert all(m["loss"] is True for m in msgs[wait:] if m["role"] == "assistant")    # revision + good suffix
