"""Training settings from environment variables, read by the XTuner configs.

The config files themselves cannot parse them: mmengine reads XTuner configs
in "lazy import" mode, where every import of a non-builtin module becomes a
placeholder that is only resolved when the runner builds objects. So the
configs call ``from_env()`` through ``__import__`` (a plain call, which runs at
once) and copy the fields into config variables.

Defaults are XTuner's reference values for Llama-3 8B full fine-tuning
(llama3_8b_instruct_full_alpaca_e3; the paper does not publish its own),
except MAX_LENGTH: the search's prompt budget, the length
``path_collection.py export --tokenizer`` fits samples to.
"""
from __future__ import annotations

from dataclasses import dataclass

from agent_r.export import DEFAULT_MAX_LENGTH
from agent_r.settings import parse, setting


@dataclass(frozen=True)
class TrainSettings:
    model_dir: str = setting("meta-llama/Llama-3.1-8B-Instruct", env="MODEL_DIR", flag=None,
                             help="the model to fine-tune (a Hugging Face directory or hub id)")
    # Not required here: `xtuner convert pth_to_hf` loads the config without data.
    data_files: str = setting("", env="DATA_FILES", flag=None, help="the comma-separated Agent-R export JSON files")
    general_data: str = setting("", env="GENERAL_DATA", flag=None,
                                help="a ShareGPT-style JSON file of general conversations (\"\" = none)")
    eta: float = setting(0.2, env="ETA", flag=None, minimum=0.0, help="the number of general samples per agent sample")
    seed: int = setting(0, env="SEED", flag=None, help="the seed for data mixing, shuffling and initialisation")
    max_length: int = setting(DEFAULT_MAX_LENGTH, env="MAX_LENGTH", flag=None, minimum=16,
                              help="the tokens per training sequence; XTuner cuts longer samples from their end, so "
                              "export with the same MAX_LENGTH and --tokenizer to fit them first "
                              f"(default {DEFAULT_MAX_LENGTH}, the search's prompt budget)")
    pack: bool = setting(True, env="PACK", flag=None, help="1 to pack samples into MAX_LENGTH sequences, 0 not to")
    map_num_proc: int = setting(32, env="MAP_NUM_PROC", flag=None, minimum=1, help="the processes that tokenise the data")
    batch_size: int = setting(1, env="BATCH_SIZE", flag=None, minimum=1, help="the sequences per device per step")
    accumulative_counts: int = setting(16, env="ACCUMULATIVE_COUNTS", flag=None, minimum=1,
                                       help="the gradient accumulation steps")
    epochs: int = setting(3, env="EPOCHS", flag=None, minimum=1, help="the number of training epochs")
    lr: float = setting(2e-5, env="LR", flag=None, minimum=0.0, help="the peak learning rate")
    warmup_ratio: float = setting(0.03, env="WARMUP_RATIO", flag=None, minimum=0.0,
                                  help="the fraction of training spent warming up (0 = none)")
    save_steps: int = setting(500, env="SAVE_STEPS", flag=None, minimum=1, help="the iterations between checkpoints")
    save_total_limit: int = setting(2, env="SAVE_TOTAL_LIMIT", flag=None, minimum=-1,
                                    help="the checkpoints kept (-1 = all)")
    work_dir: str | None = setting(None, env="WORK_DIR", flag=None, help="where logs and checkpoints go")


def from_env() -> TrainSettings:
    return parse(TrainSettings, argv=[], prog="xtuner train")
