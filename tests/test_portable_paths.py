"""agent_r.paths.portable and portable_paths: what committed files record.
A path inside a run folder is relative to the run even when the run folder
lies inside the repository (where runs/ is by default); every absolute path
of a comma-separated list (GENERAL_DATA) is made portable; an adapter's
record names its base and data relative to the repository."""
from __future__ import annotations

import json

from agent_r.paths import REPOSITORY, portable, portable_paths


def test_a_path_in_a_run_inside_the_repository_is_relative_to_the_run():
    run = REPOSITORY / "runs" / "smollm2"
    assert portable(run / "iter_1" / "model" / "agent-r" / "hf", run) == "iter_1/model/agent-r/hf"
    assert portable(REPOSITORY / "models" / "textcraft-base", run) == "models/textcraft-base"   # outside the run
    assert portable("/elsewhere/model", run) == "/elsewhere/model"                              # outside both


def test_every_absolute_path_of_a_comma_separated_list_is_made_portable():
    run = REPOSITORY / "runs" / "r"
    value = f"{run}/general_data/policy.json,{run}/general_data/verifier_all.json,{REPOSITORY}/x.jsonl"
    assert portable_paths({"general_data": value}, run) == {
        "general_data": "general_data/policy.json,general_data/verifier_all.json,x.jsonl"}
    mixed = f"relative.json,{REPOSITORY}/models/m"          # an absolute path after a relative one too
    assert portable_paths([mixed]) == ["relative.json,models/m"]
    assert portable_paths("Thought: a/b, c\nAction: get 1 /x") == "Thought: a/b, c\nAction: get 1 /x"


def test_a_new_adapter_record_holds_no_absolute_path(tmp_path):
    """save_adapter writes the record portable: a base in the repository by its repository path."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from agent_r.training.adapter import ADAPTER_RECORD, save_adapter

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    record = {"base": str(REPOSITORY / "models" / "smollm2-textcraft-base"),
              "data_files": [str(REPOSITORY / "runs" / "r" / "iter_1" / "data" / "agent-r" / "train.json")],
              "general_data": f"{REPOSITORY}/runs/r/general_data/policy.json,{REPOSITORY}/runs/r/g/v.json"}
    save_adapter(peft_model, tmp_path / "adapter", record)
    text = (tmp_path / "adapter" / ADAPTER_RECORD).read_text()
    assert str(REPOSITORY) not in text
    assert json.loads(text)["base"] == "models/smollm2-textcraft-base"
    assert str(REPOSITORY) not in (tmp_path / "adapter" / "adapter_config.json").read_text()
