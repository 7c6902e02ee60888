"""The loop with TRAINER=trl and the eto variant, end to end on the real local
TextCraft server with the tiny random Llama really trained by TRL (SFT for
agent-r, DPO for eto): the rows, the pairs, the loss histories in the stage
statistics; and an iteration whose trees hold no success/failure pair skips
the eto variant's training with one logged line instead of failing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.loop import run, trl_stages
from agent_r.loop.models import Policy
from agent_r.loop.stages import search_settings
from tests.loop.conftest import FLAGS, SMALL, settings_for
from tests.loop.doubles import weights_digest
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend

TRL = {**SMALL, "TRAINER": "trl", "VARIANTS": "agent-r,eto", "ITERATIONS": "1", "ETO_LR": "1e-3",
       "PRECISION": "fp32", "GRADIENT_CHECKPOINTING": "0"}


def test_trl_trainer_and_the_eto_variant_end_to_end(base_model, textcraft_server, tmp_path):
    env = {**TRL, "TASK": "textcraft", "MODEL_DIR": base_model}
    result = run(settings_for(env, FLAGS + ["--env_server_base", textcraft_server, "--runs_dir", str(tmp_path),
                                            "--name", "trl"]))
    assert result.exit_code == 0, result.incomplete
    root = result.root
    rows = {(r["iteration"], r["variant"]): r for r in json.loads((root / "results.json").read_text())["rows"]}
    assert list(rows) == [(0, "base"), (1, "agent-r"), (1, "eto")]
    assert "| 1 | eto |" in (root / "results.md").read_text()

    sft = rows[(1, "agent-r")]["train"]
    assert sft["trainer"] == "trl" and sft["steps"] > 0 and len(sft["losses"]) == sft["steps"]
    assert not {"config", "seconds", "hf"} & set(sft)                  # the same on every rerun

    eto = rows[(1, "eto")]
    pairs = json.loads((root / "iter_1" / "data" / "eto" / "train.json").read_text())
    got = eto["data"]["tasks"]["textcraft"]
    assert got["eto_pairs"] == len(pairs) == eto["data"]["train_samples"] > 0
    assert got["trees_with_pair"] == len(pairs) <= got["trees"]     # ETO's one pair per tree
    assert all(p["id"].startswith("textcraft/") and p["chosen_score"] == 1.0 > p["rejected_score"] for p in pairs)
    assert eto["search"] == rows[(1, "agent-r")]["search"]           # iteration 1 shares the base model's trees
    dpo = eto["train"]
    assert dpo["trainer"] == "trl-dpo" and dpo["samples"] == len(pairs) and len(dpo["losses"]) == dpo["steps"]
    assert dpo["losses"][0] == pytest.approx(0.6931, abs=1e-3)       # the reference is the model it starts from
    # each row reports its own trainer's settings: DPO ran ETO_EPOCHS=3 at ETO_LR, the SFT EPOCHS=1
    history = json.loads((root / "iter_1" / "model" / "eto" / "loss_history.json").read_text())
    assert round(history[-1]["epoch"]) == 3 == eto["epochs"] == dpo["epochs"]
    assert (eto["lr"], eto["beta"], "alpha" in eto) == (1e-3, 0.1, False)
    assert (rows[(1, "agent-r")]["epochs"], sft["epochs"], rows[(1, "agent-r")]["lr"]) == (1, 1, 1e-3)
    assert eto["model"] == "iter_1/model/eto/hf" and eto["started_from"] == base_model
    assert weights_digest(str(root / eto["model"])) != weights_digest(base_model)
    assert eto["test"]["textcraft"]["tasks"] == 3


def never_succeeds(model_dir: str, **options) -> ScriptedBackend:
    """Test double: a policy that only ever looks at its inventory."""
    return ScriptedBackend(lambda messages, index, seed: "Thought: I check what I have.\nAction: inventory")


def test_no_pair_in_any_tree_is_one_logged_line_and_no_training_file(base_model, tmp_path, caplog):
    s = settings_for({**TRL, "TASK": "textcraft", "MODEL_DIR": base_model}, FLAGS)
    p = Policy("base", base_model, s.backend)
    trees = tmp_path / "trees"
    folder = search_settings(s, "textcraft", trees, p).out_dir()
    only_wins = tf.make_root()
    tf.add_step(only_wins, "get 4 stick", "Got 4 stick", score=1)
    for idx, tree in enumerate([tf.tree_no_success(), tf.backup(only_wins)]):
        tf.write_tree(tree, folder, idx)
    train_file = tmp_path / "data" / "train.json"
    with caplog.at_level("INFO", logger="agent_r.loop.trl_stages"):
        stats = trl_stages.data_stage(s, trees, tmp_path / "data", p, train_file)
    assert stats == {"tasks": {"textcraft": {"trees": 2, "trees_with_pair": 0, "eto_pairs": 0, "rejected_cut": 0}},
                     "train_samples": 0}
    assert not train_file.exists()
    said = [r for r in caplog.records if r.name == "agent_r.loop.trl_stages"]
    assert len(said) == 1 and said[0].levelname == "WARNING" and "keeps its model this iteration" in said[0].message


def test_an_iteration_without_pairs_skips_the_eto_variant(base_model, textcraft_server, tmp_path, caplog):
    env = {**TRL, "TASK": "textcraft", "MODEL_DIR": base_model, "VARIANTS": "eto",
           "BACKEND": f"python:{__name__}:never_succeeds"}
    with caplog.at_level("WARNING"):
        result = run(settings_for(env, FLAGS + ["--revise_limit", "0", "--env_server_base", textcraft_server,
                                                "--runs_dir", str(tmp_path), "--name", "none"]))
    assert result.exit_code == 0, result.incomplete
    row = result.rows[-1]
    assert (row["iteration"], row["variant"]) == (1, "eto")
    assert row["data"]["train_samples"] == 0 and row["train"] == {"trainer": None, "skipped": "no training samples"}
    assert row["model"] == row["started_from"] == base_model and row["test"]["textcraft"]["tasks"] == 3
    assert not Path(result.root, "iter_1", "model", "eto", "hf").exists()
    assert sum("ETO pairs a success with a failure" in r.message for r in caplog.records) == 1


def test_train_from_base_pools_every_iterations_pairs_into_one_file(tmp_path):
    files = []
    for k in (1, 2):
        path = tmp_path / f"iter_{k}.json"
        path.write_text(json.dumps([{"id": f"textcraft/search_results_{k}/0"}]))
        files.append(str(path))
    assert trl_stages.pooled_pairs(files[:1], tmp_path / "model") == files[0]
    joined = trl_stages.pooled_pairs(files, tmp_path / "model")
    assert [p["id"] for p in json.loads(Path(joined).read_text())] == ["textcraft/search_results_1/0",
                                                                      "textcraft/search_results_2/0"]


def test_trl_missing_is_named_before_any_stage_runs(base_model, monkeypatch):
    import importlib.util

    from agent_r.loop.train import check_trainer
    from agent_r.settings import UsageError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    for env in ({"TRAINER": "trl", "VARIANTS": "agent-r"}, {"TRAINER": "cpu", "VARIANTS": "good,eto"}):
        s = settings_for({**TRL, "TASK": "textcraft", "MODEL_DIR": base_model, **env}, FLAGS)
        with pytest.raises(UsageError, match=r"TRL is not installed .*pip install -r requirements.txt"):
            check_trainer(s)
    assert check_trainer(settings_for({**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model}, FLAGS)) == "cpu"
