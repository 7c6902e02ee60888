"""The training knobs, declared once for both trainers and the export.

``TrainKnobs`` is what every trainer honours with the same meaning (XTuner
through ``xtuner_config/agent_r_llama3_8b_full.py``, the in-process CPU
trainer in ``agent_r/training/cpu.py``, TRL in ``trl_sft.py``); ``iterate.py``
nests it and hands it to each. ``TrainSettings`` is the XTuner config's whole
set: the knobs plus what only an XTuner run has (data files, packing).
``TrlKnobs`` are the TRL trainers' own, ``EtoKnobs`` ETO's DPO's; ``StepKnobs``
(batch, accumulation, warm-up, MAX_LENGTH) is the part of ``TrainKnobs`` DPO
reads too, and SEED and the checkpoint knobs are groups the XTuner config and
the TRL trainers share.

Why the config reads settings through a plain call: mmengine reads XTuner
configs in "lazy import" mode, where every import of a non-builtin module
becomes a placeholder resolved only when the runner builds objects. So the
config calls ``from_env()`` through ``__import__`` (which runs at once) and
copies the fields into config variables. This module and everything it
imports are standard-library only, so the training environment (XTuner pins
transformers 4.48) imports it too.

Defaults are the paper's for Llama-3.1-8B (LR 2e-5, 3% warm-up then cosine,
batch 1 x 16 accumulation, 3 epochs in the first self-training iteration and 1
in later ones, general data at ETA 0.2), which are also XTuner's reference
values for Llama-3 8B full fine-tuning (llama3_8b_instruct_full_alpaca_e3),
except MAX_LENGTH: the search's prompt budget, the length
``path_collection.py export --tokenizer`` fits samples to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_r.knobs import BUNDLED_MODEL_DIR, DEFAULT_MAX_TOKEN_LENGTH, ModelDir
from agent_r.settings import IntSchedule, UsageError, parse, setting

# Training sequences as long as the search's prompt budget: a sample then holds
# about the context the model had when it chose the sample's turns.
DEFAULT_MAX_LENGTH = DEFAULT_MAX_TOKEN_LENGTH
# The paper's epochs per self-training iteration: 3 in the first, then 1 "to
# mitigate overfitting"; a trainer run on its own takes the first.
PAPER_EPOCHS = (3, 1, 1)


@dataclass
class SequenceLength:
    """MAX_LENGTH: read by the export (which fits samples to it) and both trainers."""

    max_length: int = setting(DEFAULT_MAX_LENGTH, env="MAX_LENGTH", minimum=16,
                              help="the tokens per training sequence; XTuner cuts longer samples from their end, "
                              "so the export (--tokenizer) fits samples to the same value first "
                              f"(default {DEFAULT_MAX_LENGTH}, the search's prompt budget)")


@dataclass
class StepKnobs(SequenceLength):
    """How a trainer forms its steps: read by both fine-tuning trainers and by
    ETO's DPO (agent_r/training/eto.py), which has its own LR and epochs."""

    batch_size: int = setting(1, env="BATCH_SIZE", flag=None, minimum=1,
                              help="the sequences per device per step (default 1)")
    accumulative_counts: int = setting(16, env="ACCUMULATIVE_COUNTS", flag=None, minimum=1,
                                       help="the gradient accumulation steps (default 16)")
    warmup_ratio: float = setting(0.03, env="WARMUP_RATIO", flag=None, minimum=0.0,
                                  help="the fraction of training spent warming up, 0 = none (default 0.03)")


def check_warmup(knobs: Any) -> None:
    """WARMUP_RATIO must be below 1, for every trainer: at 1 the whole run
    warms up and the cosine decay never starts (TRL refuses it outright)."""
    if knobs.warmup_ratio >= 1:
        raise UsageError(f"WARMUP_RATIO={knobs.warmup_ratio} must be below 1: it is the fraction of the steps "
                         "spent warming up (the paper's is 0.03)")


@dataclass
class TrainKnobs(StepKnobs):
    """What both trainers honour with the same meaning."""

    general_data: str = setting("", env="GENERAL_DATA", flag=None,
                                help="a ShareGPT-style JSON file of general conversations mixed into training "
                                "(default: none)")
    eta: float = setting(0.2, env="ETA", flag=None, minimum=0.0,
                         help="the number of general samples per agent sample (default 0.2, the paper's)")
    epochs: int = setting(IntSchedule(PAPER_EPOCHS), env="EPOCHS", flag=None, minimum=1, schedule=True,
                          help="the number of training epochs; iterate.py also takes one value per iteration, "
                          "comma-separated (a trainer run alone uses the first) (default 3,1,1: 3 in iteration 1, "
                          "then 1, the paper's)")
    lr: float = setting(2e-5, env="LR", flag=None, minimum=0.0, help="the peak learning rate (default 2e-5)")


@dataclass
class TrainSeed:
    """SEED of a training run (the loop passes its own --seed instead)."""

    seed: int = setting(0, env="SEED", flag=None,
                        help="the seed for data mixing, shuffling and initialisation (default 0)")


@dataclass
class Checkpoints:
    """How often a training run saves a resumable checkpoint, and how many it keeps."""

    save_steps: int = setting(500, env="SAVE_STEPS", flag=None, minimum=1,
                              help="the optimizer steps between checkpoints (default 500)")
    save_total_limit: int = setting(2, env="SAVE_TOTAL_LIMIT", flag=None, minimum=-1,
                                    help="the checkpoints kept, -1 = all (default 2)")


@dataclass
class TrainSettings(ModelDir, TrainKnobs, TrainSeed, Checkpoints):
    """Every setting of the XTuner config (environment variables only)."""

    # Not required here: `xtuner convert pth_to_hf` loads the config without data.
    data_files: str = setting("", env="DATA_FILES", flag=None, help="the comma-separated Agent-R export JSON files")
    pack: bool = setting(True, env="PACK", flag=None, help="1 to pack samples into MAX_LENGTH sequences, 0 not to")
    map_num_proc: int = setting(32, env="MAP_NUM_PROC", flag=None, minimum=1, help="the processes that tokenise the data")
    work_dir: str | None = setting(None, env="WORK_DIR", flag=None, help="where logs and checkpoints go")
    prompt_template: str = setting("auto", env="PROMPT_TEMPLATE", flag=None,
                                   help="XTuner's chat template (a name in xtuner.utils.PROMPT_TEMPLATE, e.g. "
                                   "llama3_chat, qwen_chat, mistral, gemma); auto = the one matching the model's "
                                   "own chat template (default auto)")

    def finish(self) -> None:
        """MODEL_DIR unset: the bundled model, as for every other script."""
        if not (self.model_dir and self.model_dir.strip()):
            self.model_dir = str(BUNDLED_MODEL_DIR)
        self.epochs = int(self.epochs)   # one run: a per-iteration list's first value, as a plain int

    def xtuner_template(self) -> str:
        """PROMPT_TEMPLATE, ``auto`` resolved from the model folder (asked
        only by the XTuner config, so other readers of these settings need no
        local model)."""
        return xtuner_template_for(self.model_dir) if self.prompt_template == "auto" else self.prompt_template


# XTuner's template for each chat format, told apart by the format's own turn
# markers. Llama-3.1's official template (a knowledge-date preamble in the
# system turn) also gets llama3_chat, the paper's choice; our own trainers
# follow the model's template exactly (docs/training.md).
XTUNER_TEMPLATES = (("<|start_header_id|>", "llama3_chat"), ("<|im_start|>", "qwen_chat"),
                    ("<start_of_turn>", "gemma"), ("[INST]", "mistral"))


def model_chat_template(model_dir: str) -> str:
    """The chat template in a model folder's files (chat_template.jinja, or
    tokenizer_config.json's chat_template), read without transformers: the
    XTuner environment reads it too. Empty when there is none."""
    folder = Path(model_dir)
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return ""
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template") or ""
    if isinstance(template, list):   # named templates: the default one
        template = next((t.get("template", "") for t in template if t.get("name") == "default"), "")
    return template


def xtuner_template_for(model_dir: str) -> str:
    """The XTuner PROMPT_TEMPLATE name that writes the model's chat format."""
    if not Path(model_dir).is_dir():
        raise UsageError(f"MODEL_DIR={model_dir} is not a local folder, so its chat template cannot be read: set "
                         "PROMPT_TEMPLATE to the xtuner.utils.PROMPT_TEMPLATE name that writes its chat format "
                         "(e.g. llama3_chat, qwen_chat, mistral, gemma)")
    template = model_chat_template(model_dir)
    for marker, name in XTUNER_TEMPLATES:
        if marker in template:
            return name
    why = "has no chat template" if not template else "has a chat template XTuner's templates are not matched to"
    raise UsageError(f"MODEL_DIR={model_dir} {why}: set PROMPT_TEMPLATE to the xtuner.utils.PROMPT_TEMPLATE name "
                     "that writes its chat format (e.g. llama3_chat, qwen_chat, mistral, gemma)")


@dataclass
class TrlKnobs(Checkpoints):
    """What only the TRL trainers read (``TRAINER=trl``, ETO's DPO): XTuner's
    config fixes these (cosine, no weight decay, clip 1, bf16 on GPUs)."""

    lr_scheduler: str = setting("cosine", env="LR_SCHEDULER", flag=None,
                                choices=("cosine", "linear", "constant_with_warmup"),
                                help="the decay after warm-up (default cosine, to 0)")
    weight_decay: float = setting(0.0, env="WEIGHT_DECAY", flag=None, minimum=0.0,
                                  help="AdamW's weight decay (default 0)")
    max_grad_norm: float = setting(1.0, env="MAX_GRAD_NORM", flag=None, minimum=0.0,
                                   help="the gradient clipping norm, 0 = off (default 1)")
    precision: str = setting("auto", env="PRECISION", flag=None, choices=("auto", "fp32", "bf16", "fp16"),
                             help="mixed precision: auto = bf16 on a GPU that has it, else fp32 (default auto)")
    gradient_checkpointing: str = setting("auto", env="GRADIENT_CHECKPOINTING", flag=None, choices=("auto", "0", "1"),
                                          help="recompute activations to save memory: auto = on with a GPU "
                                          "(default auto)")
    save_dtype: str = setting("auto", env="SAVE_DTYPE", flag=None, choices=("auto", "fp32", "bf16", "fp16"),
                              help="the weights' dtype in hf/: auto = the training precision (default auto)")
    report_to: str = setting("none", env="REPORT_TO", flag=None, choices=("none", "tensorboard"),
                             help="where metrics go besides loss_history.json (default none; tensorboard writes "
                             "OUT/trainer/runs, offline)")
    logging_steps: int = setting(1, env="LOGGING_STEPS", flag=None, minimum=1,
                                 help="the steps per logged loss (default 1)")


@dataclass
class EtoKnobs:
    """ETO's own DPO knobs (agent_r/training/eto.py); batch, warm-up and
    length are the fine-tuning ones (StepKnobs). Defaults are ETO's for a 7B
    model; a tiny model needs a far higher learning rate to move."""

    beta: float = setting(0.1, env="ETO_BETA", flag=None, minimum=0.0, help="DPO's beta (default 0.1, ETO's)")
    lr: float = setting(1e-6, env="ETO_LR", flag=None, minimum=0.0,
                        help="the DPO peak learning rate (default 1e-6, ETO's first iteration)")
    epochs: int = setting(3, env="ETO_EPOCHS", flag=None, minimum=1, help="the DPO epochs (default 3, ETO's)")


def from_env() -> TrainSettings:
    return parse(TrainSettings, argv=[], prog="xtuner train")
