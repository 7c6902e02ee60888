"""ETO pairs from search trees and DPO on them with TRL's DPOTrainer: which
paths pair up (seeded, capped per tree, rejected cut at the chosen length + 5
rounds), the one-line error when no tree has a success and a failure, that
only the policy's turns carry weight in the DPO log-probs (through the real
trainer's collator and loss), and a tiny DPO run end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.settings import UsageError, run_cli
from agent_r.training import eto
from tests.support import tree_fixtures as tf

EOT = "<|eot_id|>"


def tree_long_failure():
    """A one-step success and a failure that wanders 8 rounds."""
    root = tf.make_root()
    tf.add_step(root, "get 4 stick", "Got 4 stick", score=1)
    node = root
    for i in range(8):
        node = tf.add_step(node, f"inventory {i}", f"Inventory: nothing {i}", score=0 if i == 7 else None)
    return tf.backup(root)


def write_trees(folder: Path, trees) -> Path:
    for idx, tree in enumerate(trees):
        tf.write_tree(tree, folder / "textcraft" / "tiny", idx)
    return folder


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> Path:
    return write_trees(tmp_path_factory.mktemp("eto_trees"), [tf.tree_many_leaves(), tf.tree_shared_prefix(),
                                                               tf.tree_no_success(), tree_long_failure()])


def assistant_texts(msgs: list[dict]) -> list[str]:
    return [m["content"] for m in msgs if m["role"] == "assistant"]


def test_pairs_pair_each_success_with_a_failure_of_its_tree_seeded_and_capped(trees, tmp_path):
    every = eto.eto_pairs([str(trees)], full_score=1.0, max_pairs_per_tree=0, seed=0)
    by_tree: dict[str, list[dict]] = {}
    for p in every:
        by_tree.setdefault(p["id"].rsplit("/", 1)[0], []).append(p)
    # many_leaves: 2 successes x 4 failures; shared_prefix 1 x 1; no_success none; long_failure 1 x 1
    assert {k.rsplit("_", 1)[1]: len(v) for k, v in by_tree.items()} == {"0": 8, "1": 1, "3": 1}
    for p in every:
        assert p["chosen_score"] == 1.0 and p["rejected_score"] < 1.0 and p["chosen"] != p["rejected"]
        assert [m["role"] for m in p["prompt"]] == ["system", "user", "assistant", "user"]
        for side in (p["chosen"], p["rejected"]):
            assert [m["role"] for m in side] == ["assistant", "user"] * (len(side) // 2) + ["assistant"]
    many = by_tree["textcraft/tiny/search_results_0"]
    assert len({json.dumps(p["chosen"]) for p in many}) == 2 and len({json.dumps(p["rejected"]) for p in many}) == 4

    long = by_tree["textcraft/tiny/search_results_3"][0]
    assert long["rejected_rounds"] == 8 and long["rejected_cut"]
    assert assistant_texts(long["rejected"]) == [tf.turn_text(f"inventory {i}") for i in range(1 + 5)]

    one = eto.eto_pairs([str(trees)], 1.0, max_pairs_per_tree=1, seed=0)
    assert len(one) == 3 and one == eto.eto_pairs([str(trees)], 1.0, 1, seed=0)          # deterministic
    firsts = {json.dumps(eto.eto_pairs([str(trees)], 1.0, 1, seed=s)[0]) for s in range(6)}
    assert len(firsts) > 1                                                                # the seed chooses
    alone = write_trees(tmp_path / "alone", [tf.tree_many_leaves()])
    assert eto.eto_pairs([str(alone)], 1.0, 0, seed=0)[0]["chosen"] == many[0]["chosen"]  # per tree, not per set
    assert eto.eto_pairs([str(trees)], 1.0, 0, seed=0, extra_rounds=0)[-1]["rejected"][-1]["content"] == \
        tf.turn_text("inventory 0")                                                       # cap = chosen length


def test_no_tree_with_a_success_and_a_failure_is_one_line(tmp_path, capsys):
    only_wins = tf.make_root()
    tf.add_step(only_wins, "get 4 stick", "Got 4 stick", score=1)
    folder = write_trees(tmp_path / "trees", [tf.tree_no_success(), tf.backup(only_wins)])
    with pytest.raises(UsageError, match="has both a full-score path"):
        eto.eto_pairs([str(folder)], 1.0)
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: eto.main(["pairs", "--trees", str(folder), "--output", str(tmp_path / "p.json")]))
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "ETO pairs a success with a failure" in err
    assert not (tmp_path / "p.json").exists()


def quick_dpo(**knobs) -> eto.EtoConfig:
    base = dict(lr=1e-3, epochs=1, max_length=512, batch_size=2, accumulative_counts=1, warmup_ratio=0.0,
                precision="fp32", gradient_checkpointing="0", save_steps=10_000, threads=1)
    return eto.EtoConfig(**{**base, **knobs})


def test_only_the_policys_turns_are_scored(trees, tiny_model_dir, tmp_path):
    import torch

    pairs = eto.eto_pairs([str(trees)], 1.0, max_pairs_per_tree=0)
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(pairs))
    run = eto.prepare_dpo(tiny_model_dir, str(path), str(tmp_path / "out"), quick_dpo(lr=0.0, batch_size=len(pairs)))
    tok = run.trainer.processing_class
    batch = next(iter(run.trainer.get_train_dataloader()))           # TRL's sampler, columns, our collator
    scored = [tok.decode(ids[m.bool()]) for ids, m in zip(batch["input_ids"], batch["completion_mask"])]
    want = {"".join(t + EOT for t in assistant_texts(p[side])) for p in pairs for side in ("chosen", "rejected")}
    observations = {m["content"] for p in pairs for side in ("chosen", "rejected") for m in p[side]
                    if m["role"] == "user"}
    assert all(text in want for text in scored), scored
    assert not any(obs in text for text in scored for obs in observations)
    n = len(pairs)
    assert {scored[i] for i in range(n)} <= {"".join(t + EOT for t in assistant_texts(p["chosen"])) for p in pairs}

    # The log-prob TRL's loss uses for "chosen" is the sum over the policy's tokens only.
    run.trainer.train()                                              # one step with every pair, lr 0
    logged = run.trainer.state.log_history[0]["logps/chosen"]
    model = run.trainer.model.eval()
    ours, everything = [], []
    for row in run.trainer.train_dataset:
        ids = torch.tensor([row["prompt_ids"] + row["chosen_ids"]])
        mask = torch.tensor([0] * len(row["prompt_ids"]) + row["chosen_mask"])[1:].bool()
        whole = torch.tensor([0] * len(row["prompt_ids"]) + [1] * len(row["chosen_ids"]))[1:].bool()
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
        ours.append(logp[mask].sum().item())
        everything.append(logp[whole].sum().item())
    assert logged == pytest.approx(sum(ours) / n, rel=1e-4)
    assert abs(sum(everything) / n - logged) > 10                   # observations would weigh a lot


def test_tiny_dpo_runs_end_to_end_and_prefers_the_successes(trees, tiny_model_dir, tmp_path, capsys, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    pairs = tmp_path / "pairs.json"
    assert eto.main(["pairs", "--trees", str(trees), "--output", str(pairs), "--max_pairs_per_tree", "0"]) == 0
    assert "wrote 10 ETO pairs" in capsys.readouterr().out
    out = tmp_path / "dpo"
    for env, value in {"ETO_LR": "1e-3", "ETO_EPOCHS": "3", "BATCH_SIZE": "2", "ACCUMULATIVE_COUNTS": "1",
                       "WARMUP_RATIO": "0", "PRECISION": "fp32", "GRADIENT_CHECKPOINTING": "0",
                       "LR": "7", "EPOCHS": "9"}.items():          # fine-tuning's LR and EPOCHS are not DPO's
        monkeypatch.setenv(env, value)
    monkeypatch.setenv("MODEL_DIR", tiny_model_dir)
    assert eto.main(["train", "--pairs", str(pairs), "--out", str(out),
                     "--max_length", "512", "--threads", "1"]) == 0
    stats = json.loads((out / "train_stats.json").read_text())
    assert stats["trainer"] == "trl-dpo" and stats["samples"] == 10 and stats["steps"] == 3 * 5
    assert (stats["config"]["lr"], stats["config"]["epochs"], stats["config"]["beta"]) == (1e-3, 3, 0.1)
    history = json.loads((out / "loss_history.json").read_text())
    assert history[0]["loss"] == pytest.approx(0.6931, abs=1e-3)    # policy == reference at the start
    tail = history[-5:]
    assert sum(r["loss"] for r in tail) / 5 < 0.3 and all(r["rewards/margins"] > 0 for r in tail)
    policy = AutoModelForCausalLM.from_pretrained(out / "hf")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert any(not torch.equal(v, base.state_dict()[k]) for k, v in policy.state_dict().items())


def test_a_lora_dpo_trains_an_adapter_against_its_start_model(trees, tiny_model_dir, tmp_path):
    """With a LoRA the policy is the start model plus a trained adapter and
    the reference is the start model itself (the adapter off): the first
    loss is log 2, the policy then prefers the successes, and the adapter
    merged into the untouched start model is the saved model."""
    from agent_r.io import file_sha256
    from agent_r.training.adapter import ADAPTER_RECORD, CHECKSUM, Lora, apply_adapter

    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps(eto.eto_pairs([str(trees)], 1.0, max_pairs_per_tree=0)))
    before = file_sha256(Path(tiny_model_dir) / "model.safetensors")
    out = tmp_path / "dpo"
    stats = eto.train_dpo(tiny_model_dir, str(pairs), str(out), quick_dpo(lr=1e-2, epochs=3),
                          lora=Lora(rank=4, alpha=8))
    assert file_sha256(Path(tiny_model_dir) / "model.safetensors") == before       # the reference is untouched
    history = json.loads((out / "loss_history.json").read_text())
    assert history[0]["loss"] == pytest.approx(0.6931, abs=1e-3)
    assert sum(r["loss"] for r in history[-3:]) / 3 < history[0]["loss"] - 0.05
    record = json.loads((out / "adapter" / ADAPTER_RECORD).read_text())
    assert record["lora"]["rank"] == 4 and stats["adapter"] == str(out / "adapter")
    sha = file_sha256(out / "hf" / "model.safetensors")
    assert record[CHECKSUM] == sha != before
    assert apply_adapter(tiny_model_dir, out / "adapter", tmp_path / "rebuilt") == sha
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_size < (out / "hf" / "model.safetensors").stat().st_size
    # the finished run is this one's only: other LoRA settings in its folder are refused, not reused
    with pytest.raises(UsageError, match="holds a run with other settings"):
        eto.train_dpo(tiny_model_dir, str(pairs), str(out), quick_dpo(lr=1e-2, epochs=3), lora=Lora(rank=8, alpha=16))


def test_a_lora_dpo_refuses_another_reference_model(trees, tiny_model_dir, tmp_path):
    from agent_r.training.adapter import Lora

    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps(eto.eto_pairs([str(trees)], 1.0, max_pairs_per_tree=0)))
    with pytest.raises(UsageError, match="reference is its start model"):
        eto.train_dpo(tiny_model_dir, str(pairs), str(tmp_path / "dpo"), quick_dpo(lr=1e-2, epochs=1),
                      ref_model_dir=str(tmp_path / "another"), lora=Lora(rank=4, alpha=8))
    assert eto.train_dpo(tiny_model_dir, str(pairs), str(tmp_path / "same"), quick_dpo(lr=1e-2, epochs=1),
                         ref_model_dir=tiny_model_dir, lora=Lora(rank=4, alpha=8))["steps"] > 0
