"""Every model trains the way it talks: for three chat-format families
(Llama-3, ChatML, Gemma), every trainer's encoding (the CPU trainer's
samples, TRL's dataset, ETO's DPO pairs) and the export's length counter
put exactly the inference prompt (``chat_prompt``) before each assistant
turn, train the turn's content plus the model's own end-of-turn token,
never train a loss-false turn or any system/user text, and count what they
encode. XTuner's own encoding equals ours for Llama-3 and ChatML, and a
tiny model of each family fine-tuned on one sample by the CPU trainer and
by TRL then writes that turn from the inference prompt and stops."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r import export
from agent_r.llm.chat import IGNORE, ChatFormat, chat_prompt
from agent_r.settings import UsageError
from agent_r.training import cpu, eto, trl_sft
from agent_r.training.data import training_records
from agent_r.training.settings import TrainKnobs, TrainSettings, xtuner_template_for
from tests.support.chat_families import FAMILIES, build_family_model
from tests.training.conftest import ROOT, TRAIN_VENV, run_train_env
from tests.training.samples import export_samples

FAMILY_NAMES = sorted(FAMILIES)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_model(request, tmp_path_factory) -> tuple[str, str]:
    """(family, model folder) of a tiny model per family."""
    return request.param, build_family_model(tmp_path_factory.mktemp(request.param) / "model", request.param)


def tokenizer_of(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def check_turns(tok, family: str, messages: list[dict], ids: list[int], labels: list[int]) -> int:
    """Asserts the training encoding of ``messages`` against inference;
    returns the number of trained turns seen."""
    eot = tok.convert_tokens_to_ids(FAMILIES[family].end_of_turn)
    msgs = ChatFormat.normalise(messages)
    end, trained_turns = 0, 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = tok(chat_prompt(tok, msgs[:i]), add_special_tokens=False)["input_ids"]
        assert ids[:len(prompt)] == prompt, f"turn {i}: the tokens before it are not the inference prompt"
        assert all(y == IGNORE for y in labels[end:len(prompt)]), f"turn {i}: system/user tokens are trained"
        answer = tok(m["content"].strip(), add_special_tokens=False)["input_ids"] + [eot]
        assert ids[len(prompt):len(prompt) + len(answer)] == answer, f"turn {i}: not the content + end-of-turn"
        got = labels[len(prompt):len(prompt) + len(answer)]
        if str(m["loss"]).lower() == "true":
            assert got == answer
            trained_turns += 1
        else:
            assert all(y == IGNORE for y in got), f"turn {i}: a loss-false turn is trained"
        end = len(prompt) + len(answer)
    assert all(y == IGNORE for y in labels[end:])
    return trained_turns


def test_the_cpu_trainer_and_the_export_counter_encode_what_inference_prompts(family_model):
    family, model_dir = family_model
    tok = tokenizer_of(model_dir)
    samples = export_samples()
    data = cpu.examples(samples, tok, 10**6)
    kept = [s for s in samples if any(m["role"] == "assistant" and m.get("loss") for m in s["messages"][3:])]
    assert len(data) == len(kept) == 4                                 # nothing to train: dropped
    count = export.load_length_counter(model_dir)
    for sample, ex in zip(kept, data):
        assert check_turns(tok, family, sample["messages"], ex.ids, ex.labels) >= 1
        assert count(sample["messages"]) == len(ex.ids)                 # counted = encoded
    assert ChatFormat(tok).end_of_turn == FAMILIES[family].end_of_turn
    first = tok(chat_prompt(tok, samples[0]["messages"][:2]), add_special_tokens=False)["input_ids"]
    assert data[0].ids[:len(first)] == first                          # no stray BOS or token before the chat


def test_trls_dataset_encodes_what_inference_prompts(family_model, tmp_path):
    family, model_dir = family_model
    tok = tokenizer_of(model_dir)
    data = tmp_path / "train.json"
    data.write_text(json.dumps(export_samples()))
    cfg = trl_sft.TrlConfig(max_length=10**6, general_data="", eta=0.0)
    rows = trl_sft.xtuner_dataset([str(data)], tok, cfg)
    records, _ = training_records([str(data)], "", 0.0, cfg.seed)
    kept = [r for r in records if any(m["role"] == "assistant" and m.get("loss") for m in r["messages"][3:])]
    assert len(rows) == len(kept) == 4
    for record, row in zip(kept, rows):
        check_turns(tok, family, record["messages"], row["input_ids"], row["labels"])


def test_etos_pairs_encode_what_inference_prompts(family_model):
    family, model_dir = family_model
    tok = tokenizer_of(model_dir)
    head = export_samples()[0]["messages"][:4]
    turn = lambda a: {"role": "assistant", "content": f"Thought: t\nAction: {a}"}  # noqa: E731
    obs = lambda o: {"role": "user", "content": o}  # noqa: E731
    pair = {"id": "p", "prompt": head + [turn("inventory"), obs("Inventory: [stick] (1)")],
            "chosen": [turn("craft 1 stick"), obs("Crafted 1 stick"), turn("inventory")],
            "rejected": [turn("get 1 diamond"), obs("Could not execute")]}
    enc = eto.encode_pair(pair, ChatFormat(tok), 10**6)
    for side in ("chosen", "rejected"):
        ids = enc["prompt_ids"] + enc[f"{side}_ids"]
        labels = [IGNORE] * len(enc["prompt_ids"]) + [i if k else IGNORE
                                                      for i, k in zip(enc[f"{side}_ids"], enc[f"{side}_mask"])]
        messages = [dict(m, loss=False) if m["role"] == "assistant" else m for m in pair["prompt"]]
        messages += [dict(m, loss=True) if m["role"] == "assistant" else m for m in pair[side]]
        assert check_turns(tok, family, messages, ids, labels) == (2 if side == "chosen" else 1)


# --------------------------------------------------------------------------- errors and XTuner's template

def test_a_tokenizer_without_a_chat_template_gets_one_line(tmp_path):
    model_dir = build_family_model(tmp_path / "m", "chatml")
    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (Path(model_dir) / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="has no chat template.*chat_template.jinja") as err:
        ChatFormat(tokenizer_of(model_dir))
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="MODEL_DIR=.* has no chat template: set PROMPT_TEMPLATE"):
        xtuner_template_for(model_dir)


def test_a_template_that_rewrites_history_gets_one_line(tmp_path):
    """Like templates that drop earlier turns' reasoning: only the last
    assistant message is written in full, so turns cannot be cut apart."""
    model_dir = build_family_model(tmp_path / "m", "chatml")
    rewriting = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
                 "{% if message['role'] == 'assistant' and not loop.last %}{{ message['content'].split('\n')[-1] }}"
                 "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    (Path(model_dir) / "chat_template.jinja").write_text(rewriting)
    tok = tokenizer_of(model_dir)
    with pytest.raises(UsageError, match="does not start with, so its trained turns cannot be cut apart") as err:
        ChatFormat(tok).encode(export_samples()[0]["messages"], 10**6)
    assert "\n" not in str(err.value)


def test_xtuner_gets_the_template_of_the_models_format(tmp_path, family_model):
    family, model_dir = family_model
    assert xtuner_template_for(model_dir) == {"llama3": "llama3_chat", "chatml": "qwen_chat", "gemma": "gemma"}[family]
    other = build_family_model(tmp_path / "other", "chatml")
    (Path(other) / "chat_template.jinja").write_text("{% for m in messages %}### {{ m['content'] }}{% endfor %}")
    with pytest.raises(UsageError, match="not matched to: set PROMPT_TEMPLATE"):
        xtuner_template_for(other)
    with pytest.raises(UsageError, match="org/model is not a local folder.*set PROMPT_TEMPLATE"):
        xtuner_template_for("org/model")
    assert TrainSettings(model_dir="org/model", prompt_template="mistral").xtuner_template() == "mistral"


XTUNER_BUILD = ("import json, sys\nfrom mmengine.config import Config\nfrom xtuner.registry import BUILDER\n"
                "cfg = Config.fromfile(sys.argv[1])\n"
                "print(json.dumps([[s['input_ids'], s['labels']] for s in BUILDER.build(cfg.train_dataloader.dataset)]))\n")


@pytest.mark.parametrize("family", ["llama3", "chatml"])
def test_xtuners_own_encoding_equals_ours(family, tmp_path):
    """The shipped config, its template picked from the model (PROMPT_TEMPLATE
    unset), builds exactly our samples in XTuner's environment."""
    model_dir = build_family_model(tmp_path / "m", family)
    data = tmp_path / "train.json"
    data.write_text(json.dumps(export_samples()))
    r = run_train_env([str(TRAIN_VENV / "bin" / "python"), "-c", XTUNER_BUILD,
                       str(ROOT / "xtuner_config" / "agent_r_llama3_8b_full.py")],
                      MODEL_DIR=model_dir, DATA_FILES=data, PACK=0, MAX_LENGTH=256)
    xtuner = json.loads(r.stdout.strip().splitlines()[-1])
    ours = [[e.ids, e.labels] for e in cpu.examples(export_samples(), tokenizer_of(model_dir), 256)]
    assert len(ours) == 4 and ours == xtuner


# --------------------------------------------------------------------------- the model learns its own format

SAMPLE = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Craft things."},
          {"role": "assistant", "content": "Ok.", "loss": False},
          {"role": "user", "content": "Goal: craft acacia planks."},
          {"role": "assistant", "content": "Thought: get logs.\nAction: get 1 acacia logs", "loss": True}]


def greedy_turn(model_dir: str, family: str) -> tuple[str, bool]:
    """(text before the end-of-turn token, whether it stopped there) from the
    inference prompt of SAMPLE's last turn."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = tokenizer_of(model_dir)
    eot = tok.convert_tokens_to_ids(FAMILIES[family].end_of_turn)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = tok(chat_prompt(tok, SAMPLE[:4]), add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=eot, pad_token_id=eot)
    new = out[0, prompt.shape[1]:].tolist()
    stopped = eot in new
    return tok.decode(new[:new.index(eot)] if stopped else new), stopped


@pytest.mark.parametrize("trainer", ["cpu", "trl"])
def test_a_model_fine_tuned_on_one_sample_writes_it_and_stops(family_model, trainer, tmp_path):
    family, model_dir = family_model
    data = tmp_path / "one.json"
    data.write_text(json.dumps([{"messages": SAMPLE}]))
    knobs = dict(lr=3e-3, epochs=40, batch_size=1, accumulative_counts=1, warmup_ratio=0.0, max_length=512,
                 general_data="", eta=0.0)
    out = tmp_path / "tuned"
    if trainer == "cpu":
        cpu.fine_tune(model_dir, [str(data)], str(out), TrainKnobs(**knobs), threads=1)
        tuned = out
    else:
        cfg = trl_sft.TrlConfig(**knobs, precision="fp32", gradient_checkpointing="0", save_steps=10_000, threads=1)
        trl_sft.fine_tune(model_dir, [str(data)], str(out), cfg)
        tuned = out / "hf"
    assert greedy_turn(str(tuned), family) == (SAMPLE[-1]["content"], True)
