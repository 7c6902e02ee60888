"""What the two TRL trainers (SFT in ``trl_sft.py``, ETO's DPO in
``eto.py``) share beyond the run folder (``resume.py``): the tokenizer load,
the checks and keywords of their TrainingArguments, and where their logs go.
Its own module so neither trainer imports the other."""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator, Optional

from agent_r.settings import UsageError, setting
from agent_r.training.resume import cuda

log = logging.getLogger(__name__)


def threads_setting() -> Any:
    return setting(0, minimum=0, help="torch CPU threads per process, 0 = torch's default (default 0)")


def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    if not Path(model_dir).is_dir():
        raise UsageError(f"MODEL_DIR={model_dir} is not a folder: set it to a Hugging Face model folder")
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        why = (str(exc).splitlines() or [""])[0]
        raise UsageError(f"MODEL_DIR={model_dir}: no tokenizer loads from it ({why})") from None


@contextlib.contextmanager
def tensorboard_dir(path: Path) -> Iterator[None]:
    """transformers' TensorBoard callback reads its folder from the
    environment when the trainer is built; set it only for that moment."""
    old = os.environ.get("TENSORBOARD_LOGGING_DIR")
    os.environ["TENSORBOARD_LOGGING_DIR"] = old or str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TENSORBOARD_LOGGING_DIR", None)


def checkpointing_kwargs(args_class: type, cfg: Any) -> dict[str, bool]:
    """GRADIENT_CHECKPOINTING as the keyword ``args_class`` (a TrainingArguments
    dataclass: SFTConfig, DPOConfig) takes. transformers 5.23 renamed
    ``gradient_checkpointing`` to ``activation_checkpointing`` and keeps the old
    name as a deprecated alias; releases before it only know the old name and
    reject the new one, and requirements.txt allows both."""
    on = cfg.gradient_checkpointing == "1" or (cfg.gradient_checkpointing == "auto" and cuda())
    names = {f.name for f in fields(args_class)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": on}


def quiet_logs(trainer: Any) -> Any:
    """transformers prints every log dict to stdout (PrinterCallback);
    stdout is for the command's result lines, so the logs go to ``logging``."""
    from transformers import PrinterCallback, TrainerCallback

    class LogToLogging(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
            if state.is_world_process_zero and logs:
                shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in logs.items())
                log.info("step %d/%d: %s", state.global_step, state.max_steps, shown)

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(LogToLogging())
    return trainer
