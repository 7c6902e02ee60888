"""DPO pairs TRL can score, checked with TRL itself: the ``--layout trl``
export loads in DPOTrainer, and the tokens its loss puts the preference on
(the collator's completion mask) are the two assistant turns where the paths
part, never an observation."""
from __future__ import annotations

import pytest

from agent_r import export
from agent_r.llm import BUNDLED_MODEL
from tests.support import tree_fixtures as tf
from tests.support.export_rows import revision_rows


trl = pytest.importorskip("trl", reason="TRL is in requirements.txt: pip install -r requirements.txt")


def observations(rows: list[dict]) -> set[str]:
    return {m["content"] for r in rows for log in (r["high_log"], r["low_log"]) for m in log[4:]
            if m["role"] == "user"}


def test_trl_puts_the_preference_on_assistant_tokens_only(tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = revision_rows(tf.tree_many_leaves(), None) + revision_rows(tf.tree_shared_prefix(), None, idx=1)
    pairs = export.dpo_pairs(rows, "trl")
    assert len(rows) == 9 and len(pairs) == 7                 # identical step pairs (same prompt and turns) once
    turns = {m["content"] for r in rows for log in (r["high_log"], r["low_log"]) for m in log[4:]
             if m["role"] == "assistant"}
    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL))
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL))
    args = trl.DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to=[],
                         use_cpu=True, save_strategy="no", bf16=False, dataset_num_proc=None)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(pairs),
                             processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    scored = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(batch["input_ids"], batch["completion_mask"])]
    end = tokenizer.eos_token                                   # the chat template's end of turn
    assert all(text.endswith(end) and text[: -len(end)] in turns for text in scored), scored
    assert not any(obs in text for text in scored for obs in observations(rows))
    chosen, rejected = scored[: len(pairs)], scored[len(pairs):]
    assert [c[: -len(end)] for c in chosen] == [p["chosen"][0]["content"] for p in pairs]
    assert [r[: -len(end)] for r in rejected] == [p["rejected"][0]["content"] for p in pairs]
    assert trainer.train().global_step == 1                     # and it trains
