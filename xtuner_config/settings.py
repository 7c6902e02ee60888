"""Training settings from environment variables, read by the XTuner configs.

The config files themselves cannot parse them: mmengine reads XTuner configs
in "lazy import" mode, where every import of a non-builtin module becomes a
placeholder that is only resolved when the runner builds objects. So the
configs call ``from_env()`` through ``__import__`` (a plain call, which runs at
once) and copy the fields into config variables.

Defaults are XTuner's reference values for Llama-3 8B full fine-tuning
(llama3_8b_instruct_full_alpaca_e3); the paper does not publish its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from agent_r.config import env_float, env_int, env_str


@dataclass(frozen=True)
class TrainSettings:
    model_dir: str
    data_files: str          # comma-separated; checked when the dataset is built
    general_data: str        # "" = no general data
    eta: float
    seed: int
    max_length: int
    pack: bool
    map_num_proc: int
    batch_size: int
    accumulative_counts: int
    epochs: int
    lr: float
    warmup_ratio: float
    save_steps: int
    save_total_limit: int
    work_dir: str | None


def from_env() -> TrainSettings:
    return TrainSettings(
        model_dir=env_str("MODEL_DIR", "the model to fine-tune (a Hugging Face directory or hub id)",
                          "meta-llama/Llama-3.1-8B-Instruct"),
        # Not required here: `xtuner convert pth_to_hf` loads the config without data.
        data_files=env_str("DATA_FILES", "the comma-separated Agent-R export JSON files", ""),
        general_data=env_str("GENERAL_DATA", "a ShareGPT-style JSON file of general conversations", ""),
        eta=env_float("ETA", "the number of general samples per agent sample", 0.2, minimum=0.0),
        seed=env_int("SEED", "the seed for data mixing, shuffling and initialisation", 0),
        max_length=env_int("MAX_LENGTH", "the tokens per training sequence", 2048, minimum=16),
        pack=bool(env_int("PACK", "1 to pack samples into MAX_LENGTH sequences, 0 not to", 1)),
        map_num_proc=env_int("MAP_NUM_PROC", "the processes that tokenise the data", 32, minimum=1),
        batch_size=env_int("BATCH_SIZE", "the sequences per device per step", 1, minimum=1),
        accumulative_counts=env_int("ACCUMULATIVE_COUNTS", "the gradient accumulation steps", 16, minimum=1),
        epochs=env_int("EPOCHS", "the number of training epochs", 3, minimum=1),
        lr=env_float("LR", "the peak learning rate", 2e-5, minimum=0.0),
        warmup_ratio=env_float("WARMUP_RATIO", "the fraction of training spent warming up (0 = none)",
                               0.03, minimum=0.0),
        save_steps=env_int("SAVE_STEPS", "the iterations between checkpoints", 500, minimum=1),
        save_total_limit=env_int("SAVE_TOTAL_LIMIT", "the checkpoints kept (-1 = all)", 2, minimum=-1),
        work_dir=env_str("WORK_DIR", "where logs and checkpoints go", "") or None,
    )
