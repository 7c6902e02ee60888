"""The in-process trainer (TRAINER=cpu) learns what XTuner would from the same
export: the token ids and label masks equal those XTuner's config builds, its
shared-prefix batches give the plain loss, its learning rate warms up as
configured, and it mixes general data at ETA exactly as XTuner's config does."""
from __future__ import annotations

import dataclasses
import json

import pytest

from agent_r.training import cpu
from agent_r.training.data import training_records
from agent_r.training.settings import TrainKnobs
from tests.training.conftest import ROOT, TRAIN_VENV, inspect_config, run_train_env
from tests.training.samples import export_samples

SHIPPED = ROOT / "xtuner_config" / "agent_r_llama3_8b_full.py"


def test_cpu_trainer_labels_equal_xtuners_openai_map_fn_and_template(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    data = tmp_path / "train.json"
    data.write_text(json.dumps(export_samples()))
    script = ("import json, sys\nfrom mmengine.config import Config\nfrom xtuner.registry import BUILDER\n"
              "cfg = Config.fromfile(sys.argv[1])\n"
              "print(json.dumps([{'ids': s['input_ids'], 'labels': s['labels']} "
              "for s in BUILDER.build(cfg.train_dataloader.dataset)]))\n")
    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-c", script,
                       str(ROOT / "xtuner_config" / "agent_r_llama3_8b_full.py")],
                      MODEL_DIR=tiny_model_dir, DATA_FILES=data, PACK=0, MAX_LENGTH=256)
    xtuner = json.loads(r.stdout.strip().splitlines()[-1])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = [{"ids": e.ids, "labels": e.labels} for e in cpu.examples(export_samples(), tok, 256)]
    assert len(ours) == len(xtuner) == 4   # the sample with nothing to train is dropped by both
    assert ours == xtuner
    assert len(ours[3]["ids"]) == 256      # cut at MAX_LENGTH
    trained = [tok.decode([i for i, y in zip(s["ids"], s["labels"]) if y != -100]) for s in ours[:2]]
    assert "craft 1 stick" not in trained[1] and "Action: wait<|eot_id|>" in trained[1]
    assert "Ok." not in trained[0] and trained[0].count("<|eot_id|>") == 2


def test_cpu_trainer_prefix_cache_gives_the_plain_loss(tiny_model_dir):
    """A batch's shared prefix runs once; the summed token loss equals each
    sample's own full forward pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = cpu.examples(export_samples()[:3], tok, 512)
    assert cpu.common_prefix(batch) > 10
    got, tokens = cpu.batch_loss(model, batch, tok.pad_token_id)
    want, n = 0.0, 0
    for ex in batch:
        k = sum(1 for y in ex.labels[1:] if y != -100)
        out = model(input_ids=torch.tensor([ex.ids]), labels=torch.tensor([ex.labels]))
        want, n = want + out.loss.item() * k, n + k
    assert tokens == n and abs(got.item() - want) < 1e-3 * want


def _export(tmp_path, samples: list[dict]) -> str:
    path = tmp_path / "train.json"
    path.write_text(json.dumps(samples))
    return str(path)


def learning_rates(tmp_path, tiny_model_dir, knobs: TrainKnobs, out: str) -> tuple[list[float], dict]:
    """(the learning rate of every optimizer step, the run's statistics)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen: list[float] = []
    hook = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    try:
        stats = cpu.fine_tune(tiny_model_dir, [_export(tmp_path, export_samples()[:4] * 3)], str(tmp_path / out),
                              knobs, seed=0)
    finally:
        hook.remove()
    return seen, stats


def test_learning_rate_warms_up_linearly_then_decays_by_cosine(tmp_path, tiny_model_dir):
    """WARMUP_RATIO of the steps rise linearly from 1e-5 x LR to LR (XTuner's
    LinearLR start factor), the rest fall by cosine towards 0, as the
    optimizer sees them step by step; WARMUP_RATIO=0 starts at LR."""
    lr, ratio = 1e-3, 0.4
    knobs = TrainKnobs(max_length=128, epochs=1, lr=lr, batch_size=1, accumulative_counts=1, warmup_ratio=ratio)
    seen, stats = learning_rates(tmp_path, tiny_model_dir, knobs, "hf")
    steps, warm = stats["steps"], int(ratio * stats["steps"])
    assert len(seen) == steps and warm >= 3
    assert seen[0] == pytest.approx(lr * 1e-5)
    rises = [b - a for a, b in zip(seen[:warm], seen[1:warm + 1])]
    assert all(r > 0 for r in rises) and max(rises) == pytest.approx(min(rises))   # linear up to the peak
    assert seen[warm] == pytest.approx(lr)
    assert all(a > b for a, b in zip(seen[warm:], seen[warm + 1:])) and seen[-1] < 0.2 * lr
    flat, _ = learning_rates(tmp_path, tiny_model_dir, dataclasses.replace(knobs, warmup_ratio=0.0), "hf0")
    assert flat[0] == pytest.approx(lr)


def test_general_data_is_mixed_at_eta_as_xtuners_config_mixes_it(tmp_path, tiny_model_dir, general_data):
    """round(ETA x agent samples) general conversations are trained on, and
    the rows are the ones XTuner's config builds from the same files and seed."""
    agent = _export(tmp_path, export_samples()[:4] * 3)
    knobs = TrainKnobs(max_length=256, epochs=1, lr=1e-4, accumulative_counts=4, warmup_ratio=0.0,
                       general_data=str(general_data), eta=0.5)
    stats = cpu.fine_tune(tiny_model_dir, [agent], str(tmp_path / "hf"), knobs, seed=0)
    assert (stats["agent_samples"], stats["general_samples"]) == (12, round(0.5 * 12))
    assert stats["samples"] == 12 + 6            # every general row has an answer to train on
    ours, _ = training_records([agent], str(general_data), 0.5, 0)
    xtuner = inspect_config(SHIPPED, "raw", MODEL_DIR=tiny_model_dir, DATA_FILES=agent, GENERAL_DATA=general_data,
                            ETA=0.5, SEED=0)["records"]
    # Arrow adds "loss": null to messages without it; drop it to compare
    assert [{"messages": [{k: v for k, v in m.items() if v is not None} for m in r["messages"]]} for r in xtuner] \
        == ours


@pytest.mark.parametrize("ratio", [1.0, 1.5])
def test_a_warm_up_of_the_whole_run_is_refused_by_every_trainer_and_the_loop(tmp_path, tiny_model_dir, ratio):
    """The decision: WARMUP_RATIO >= 1 is refused (the cosine decay would never
    start), by the CPU trainer, the TRL trainers and the loop before any stage."""
    from agent_r.loop import IterateSettings
    from agent_r.settings import UsageError, parse
    from agent_r.training import cpu
    from agent_r.training.settings import check_warmup

    knobs = TrainKnobs(max_length=128, epochs=1, lr=1e-3, batch_size=1, accumulative_counts=1, warmup_ratio=ratio)
    with pytest.raises(UsageError, match="must be below 1"):
        cpu.fine_tune(tiny_model_dir, [str(tmp_path / "none.json")], str(tmp_path / "out"), knobs)
    with pytest.raises(UsageError, match="must be below 1"):
        parse(IterateSettings, [], {"TASK": "textcraft", "WARMUP_RATIO": str(ratio)})
    with pytest.raises(UsageError, match="must be below 1"):
        check_warmup(knobs)
    check_warmup(dataclasses.replace(knobs, warmup_ratio=0.99))   # just below is a warm-up, allowed
