"""The training knobs, declared once for both trainers and the export.

``TrainKnobs`` is what both trainers honour with the same meaning (XTuner
through ``xtuner_config/agent_r_llama3_8b_full.py``, the in-process CPU
trainer in ``agent_r/training/cpu.py``); ``iterate.py`` nests it and hands it
to either. ``TrainSettings`` is the XTuner config's whole set: the knobs plus
what only an XTuner run has (data files, packing, checkpoints).

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

from dataclasses import dataclass

from agent_r.settings import BUNDLED_MODEL_DIR, DEFAULT_MAX_TOKEN_LENGTH, IntSchedule, ModelDir, parse, setting

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
class TrainKnobs(SequenceLength):
    """What both trainers honour with the same meaning."""

    general_data: str = setting("", env="GENERAL_DATA", flag=None,
                                help="a ShareGPT-style JSON file of general conversations mixed into training "
                                "(default: none)")
    eta: float = setting(0.2, env="ETA", flag=None, minimum=0.0,
                         help="the number of general samples per agent sample (default 0.2, the paper's)")
    batch_size: int = setting(1, env="BATCH_SIZE", flag=None, minimum=1,
                              help="the sequences per device per step (default 1)")
    accumulative_counts: int = setting(16, env="ACCUMULATIVE_COUNTS", flag=None, minimum=1,
                                       help="the gradient accumulation steps (default 16)")
    epochs: int = setting(IntSchedule(PAPER_EPOCHS), env="EPOCHS", flag=None, minimum=1, schedule=True,
                          help="the number of training epochs; iterate.py also takes one value per iteration, "
                          "comma-separated (a trainer run alone uses the first) (default 3,1,1: 3 in iteration 1, "
                          "then 1, the paper's)")
    lr: float = setting(2e-5, env="LR", flag=None, minimum=0.0, help="the peak learning rate (default 2e-5)")
    warmup_ratio: float = setting(0.03, env="WARMUP_RATIO", flag=None, minimum=0.0,
                                  help="the fraction of training spent warming up, 0 = none (default 0.03)")


@dataclass
class TrainSettings(ModelDir, TrainKnobs):
    """Every setting of the XTuner config (environment variables only)."""

    # Not required here: `xtuner convert pth_to_hf` loads the config without data.
    data_files: str = setting("", env="DATA_FILES", flag=None, help="the comma-separated Agent-R export JSON files")
    seed: int = setting(0, env="SEED", flag=None, help="the seed for data mixing, shuffling and initialisation")
    pack: bool = setting(True, env="PACK", flag=None, help="1 to pack samples into MAX_LENGTH sequences, 0 not to")
    map_num_proc: int = setting(32, env="MAP_NUM_PROC", flag=None, minimum=1, help="the processes that tokenise the data")
    save_steps: int = setting(500, env="SAVE_STEPS", flag=None, minimum=1, help="the iterations between checkpoints")
    save_total_limit: int = setting(2, env="SAVE_TOTAL_LIMIT", flag=None, minimum=-1,
                                    help="the checkpoints kept (-1 = all)")
    work_dir: str | None = setting(None, env="WORK_DIR", flag=None, help="where logs and checkpoints go")

    def finish(self) -> None:
        """MODEL_DIR unset: the bundled model, as for every other script."""
        if not (self.model_dir and self.model_dir.strip()):
            self.model_dir = str(BUNDLED_MODEL_DIR)
        self.epochs = int(self.epochs)   # one run: a per-iteration list's first value, as a plain int


def from_env() -> TrainSettings:
    return parse(TrainSettings, argv=[], prog="xtuner train")
