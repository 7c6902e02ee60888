"""What TRL trains on equals what XTuner trains on: the token ids and labels
that reach the model inside TRL's training loop (after TRL's dataset
preparation and collator) are, sample for sample, the ids and labels XTuner
itself builds from the same export and general data (XTuner 0.2.0 in
.venv-train, the shipped config, PACK=0), including a sample XTuner cuts at
MAX_LENGTH and one the cut leaves with nothing to train (dropped by both)."""
from __future__ import annotations

import json
from pathlib import Path

from agent_r.training import trl_sft
from agent_r.llm.chat import ChatFormat
from tests.training.conftest import TRAIN_VENV, run_train_env
from tests.training_trl.conftest import ROOT, quick

XTUNER_BUILD = ("import json, sys\nfrom mmengine.config import Config\nfrom xtuner.registry import BUILDER\n"
                "cfg = Config.fromfile(sys.argv[1])\n"
                "built = BUILDER.build(cfg.train_dataloader.dataset)\n"
                "print(json.dumps([[s['input_ids'], s['labels']] for s in built]))\n")


def xtuner_built(data: Path, model_dir: str, max_length: int, general: Path, eta: float) -> list[list]:
    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-c", XTUNER_BUILD,
                       str(ROOT / "xtuner_config" / "agent_r_llama3_8b_full.py")],
                      MODEL_DIR=model_dir, DATA_FILES=data, PACK=0, MAX_LENGTH=max_length, GENERAL_DATA=general,
                      ETA=eta, SEED=0)
    return json.loads(r.stdout.strip().splitlines()[-1])


def cut_length(data: Path, model_dir: str) -> int:
    """A MAX_LENGTH that drops the sample whose trained part starts last and
    cuts another one that keeps trained tokens (checked)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    spans = []
    for sample in json.loads(data.read_text()):
        ids, labels = ChatFormat(tok).encode(sample["messages"], 10**6)
        spans.append((next(i for i, y in enumerate(labels) if y != -100), len(ids)))
    length = max(first for first, _ in spans)
    assert any(first < length < n for first, n in spans), spans      # a sample is cut and still trains
    assert any(n <= length for _, n in spans), spans                  # and some fit whole
    return length


def test_trl_trains_on_xtuners_token_ids_and_labels(trl_export, general_file, tiny_model_dir, tmp_path):
    samples = json.loads(trl_export.read_text())
    flags = [m["loss"] for s in samples for m in s["messages"][3:] if m["role"] == "assistant"]
    assert True in flags and False in flags                            # bad prefixes without loss are present
    length = cut_length(trl_export, tiny_model_dir)
    eta = 0.5
    want = xtuner_built(trl_export, tiny_model_dir, length, general_file, eta)

    cfg = quick(max_length=length, general_data=str(general_file), eta=eta, batch_size=3, lr=1e-4)
    run = trl_sft.prepare(tiny_model_dir, [str(trl_export)], str(tmp_path / "out"), cfg)
    seen: list[list] = []

    def record(module, args, kwargs):          # what the model is called with inside trainer.train()
        ids, labels, mask = kwargs["input_ids"], kwargs["labels"], kwargs["attention_mask"]
        for i in range(ids.shape[0]):
            n = int(mask[i].sum())
            assert bool(mask[i, :n].all()) and bool((labels[i, n:] == -100).all())   # right padding, never trained
            seen.append([ids[i, :n].tolist(), labels[i, :n].tolist()])

    hook = run.trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        run.trainer.train()
    finally:
        hook.remove()

    n_general = round(eta * len(samples))
    assert len(want) == len(seen) == run.samples < len(samples) + n_general   # the cut-to-nothing sample is dropped
    assert sorted(map(json.dumps, seen)) == sorted(map(json.dumps, want))
    assert any(len(ids) == length for ids, _ in seen)                          # the cut sample, as XTuner cut it
    assert sum("plus" in run.trainer.processing_class.decode(ids) for ids, _ in seen) == n_general

    args = run.trainer.args                     # the paper's optimizer settings reach TRL
    assert (args.weight_decay, args.max_grad_norm, args.adam_beta1, args.adam_beta2) == (0.0, 1.0, 0.9, 0.999)
    assert {g["weight_decay"] for g in run.trainer.optimizer.param_groups} == {0.0}
