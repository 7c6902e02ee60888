"""ETO on the project's search trees: success/failure trajectory pairs, and
DPO on them with TRL, scoring only the policy's own turns.

    [TASK=textcraft] python -m agent_r.training.eto pairs --trees TREES_DIR... --output pairs.json
    MODEL_DIR=MODEL [ETO_LR=... ETO_BETA=...] python -m agent_r.training.eto train --pairs pairs.json --out OUT

ETO (exploration-based trajectory optimization) contrasts, for one task, a
successful trajectory with a failed one the agent explored, and trains the
policy with DPO against a frozen reference (the policy it starts from). Here
both trajectories come from the same MCTS tree, so they share the task.

How pairs are chosen (``eto_pairs``), per tree (= per task):

* chosen candidates: leaf paths whose score reaches the task's full score
  (``full_score``: 1 for TextCraft/WebShop, 100 for SciWorld; the env's
  ``max_score``), kept once per distinct sequence of turns, in stored order;
* rejected candidates: leaf paths scoring below it, likewise;
* every (chosen, rejected) combination, shuffled by ``random.Random`` seeded
  with ``"<seed>/<tree name>"`` (so a tree's pairs do not depend on the other
  trees), the first ``max_pairs_per_tree`` kept (0 = all; the default 1 is
  ETO's one explored failure per task);
* a rejected trajectory is cut after ``len(chosen) + extra_rounds`` rounds
  (default 5), as ETO caps its exploration at the expert's length plus 5;
  a round is one assistant turn and the observation it got;
* the prompt is the tree's head (system, instruction, "Ok.", the task); chosen
  and rejected are alternating assistant turns and observations, from the
  first turn, ending with the last assistant turn.

A tree without both kinds of leaf gives no pair; when no tree gives one,
``UsageError`` says so in one line.

Scoring (``TurnMaskedDPOTrainer``): TRL 1.16's DPOTrainer tokenizes text
prompt/chosen/rejected itself and puts the preference on every completion
token, observations included. Here pairs are tokenized as the SFT samples
are, in the model's own chat format (``ChatFormat``: the assistant turns and
the model's end-of-turn token are the trained tokens, observations and chat
headers not),
and the collator multiplies TRL's completion mask by that per-token mask, so
TRL's own loss code (labels -100 there, zero log-probability) sums log-probs
over the policy's turns only, for the policy and the reference alike.

ETO's settings: beta 0.1, learning rate 1e-6 (first iteration), 3 epochs
(ETO_BETA, ETO_LR, ETO_EPOCHS); the batch, warm-up and cosine schedule are
the fine-tuning knobs (BATCH_SIZE, ACCUMULATIVE_COUNTS, WARMUP_RATIO, ...). Those values
are for a 7B model; a tiny random model does not move measurably at 1e-6 in
a few steps, so the tests (and a CPU loop) raise the learning rate to 1e-3
and keep beta and the epochs.
"""
from __future__ import annotations

import logging
import random
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from agent_r.io import atomic_write_json, read_json
from agent_r.knobs import BUNDLED_MODEL_DIR, DEFAULT_TASK, ModelDir, TaskChoice, group_values
from agent_r.settings import UsageError, nested, parse, run_cli, setting
# The SFT encoding (XTuner's), so that DPO scores exactly the tokens SFT trains.
from agent_r.llm.chat import IGNORE, ChatFormat
from agent_r.training.adapter import lora_record
from agent_r.training.resume import Run, cuda, is_main_process, precision, run_key, train_once
from agent_r.training.settings import EtoKnobs, StepKnobs, TrainSeed, TrlKnobs, check_warmup
from agent_r.training.trl_shared import (checkpointing_kwargs, load_tokenizer, quiet_logs,
                                         tensorboard_dir, threads_setting)
from agent_r.tree import Node, leaf_paths, load_tree

log = logging.getLogger(__name__)

TREE_FILE = re.compile(r"^search_results_(\d+)\.json$")
DPO_LOGGED = ("step", "epoch", "loss", "learning_rate", "grad_norm", "rewards/chosen", "rewards/rejected",
              "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected")


# --------------------------------------------------------------------------- pairs

def find_tree_files(paths: list[str]) -> list[tuple[str, Path]]:
    """(name, file) of every ``search_results_<idx>.json`` in ``paths``
    (files, or folders searched recursively), sorted by name."""
    found = []
    for p in map(Path, paths):
        if p.is_file():
            found.append((p.stem, p))
        elif p.is_dir():
            found += trees_under(p)
        else:
            raise UsageError(f"--trees {p} does not exist: pass the folders mcts_collection.py wrote")
    if not found:
        raise UsageError(f"no search_results_<idx>.json tree under {', '.join(paths)}: run mcts_collection.py first")
    return sorted(found)


def trees_under(folder: Path) -> list[tuple[str, Path]]:
    """(name relative to ``folder``, file) of every tree under it, sorted; none when it does not exist."""
    return sorted((str(f.relative_to(folder).with_suffix("")), f) for f in folder.rglob("search_results_*.json")
                  if TREE_FILE.match(f.name))


def messages_of(path: list[Node]) -> list[dict]:
    """A leaf path's rounds as messages: assistant turn, observation, ..."""
    out = []
    for node in path:
        turn, obs = node.state[-2], node.state[-1]
        out += [{"role": "assistant", "content": str(turn["content"])},
                {"role": "user", "content": str(obs["content"])}]
    return out


def distinct(paths: list[list[Node]]) -> list[list[Node]]:
    out, seen = [], set()
    for path in paths:
        key = tuple(n.llm_response for n in path)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def tree_pairs(name: str, root: Node, full_score: float, max_pairs: int, seed: int, extra_rounds: int) -> list[dict]:
    """The ETO pairs of one tree (see the module docstring)."""
    leaves = leaf_paths(root)
    wins = distinct([p for p in leaves if p[-1].env_score >= full_score])
    losses = distinct([p for p in leaves if p[-1].env_score < full_score])
    combos = [(w, f) for w in wins for f in losses]
    random.Random(f"{seed}/{name}").shuffle(combos)
    if max_pairs > 0:
        combos = combos[:max_pairs]
    head = [{"role": m["role"], "content": m["content"]} for m in root.state[:4]]
    pairs = []
    for k, (win, fail) in enumerate(combos):
        cut = fail[:len(win) + extra_rounds]
        chosen, rejected = messages_of(win)[:-1], messages_of(cut)[:-1]   # end on the last assistant turn
        pairs.append({"id": f"{name}/{k}", "prompt": head, "chosen": chosen, "rejected": rejected,
                      "chosen_score": win[-1].env_score, "rejected_score": fail[-1].env_score,
                      "rejected_rounds": len(fail), "rejected_cut": len(cut) < len(fail)})
    return pairs


def pairs_of_trees(trees: list[tuple[str, Path]], full_score: float, max_pairs_per_tree: int = 1, seed: int = 0,
                   extra_rounds: int = 5) -> list[dict]:
    """The pairs of the (name, file) trees, in their order; possibly none."""
    return [pair for name, path in trees
            for pair in tree_pairs(name, load_tree(path), full_score, max_pairs_per_tree, seed, extra_rounds)]


def eto_pairs(tree_paths: list[str], full_score: float, max_pairs_per_tree: int = 1, seed: int = 0,
              extra_rounds: int = 5) -> list[dict]:
    """Every tree's pairs, in tree-name order; UsageError when there are none."""
    trees = find_tree_files(tree_paths)
    pairs = pairs_of_trees(trees, full_score, max_pairs_per_tree, seed, extra_rounds)
    if not pairs:
        raise UsageError(f"none of the {len(trees)} trees under {', '.join(tree_paths)} has both a full-score path "
                         f"(score >= {full_score:g}) and a lower one, and ETO pairs a success with a failure of the "
                         "same task: search more (ITERA, N_GEN) or more tasks")
    return pairs


# --------------------------------------------------------------------------- tokenizing

def encode_pair(pair: dict, fmt: ChatFormat, max_length: int) -> Optional[dict]:
    """prompt/chosen/rejected ids and a 0/1 mask per completion token (1 =
    written by the policy), the model's chat format cut at ``max_length``; None
    when the cut leaves chosen or rejected nothing to score."""
    head = [dict(m, loss=False) if m["role"] == "assistant" else m for m in pair["prompt"]]

    def enc(msgs: list[dict]) -> tuple[list[int], list[int]]:
        body = [dict(m, loss=True) if m["role"] == "assistant" else m for m in msgs]
        return fmt.encode(head + body, max_length)

    (c_ids, c_lab), (r_ids, r_lab) = enc(pair["chosen"]), enc(pair["rejected"])
    if all(y == IGNORE for y in c_lab) or all(y == IGNORE for y in r_lab):
        return None
    start = next(i for i, y in enumerate(c_lab) if y != IGNORE)
    if r_ids[:start] != c_ids[:start] or any(y != IGNORE for y in r_lab[:start]):
        raise UsageError(f"pair {pair.get('id')}: chosen and rejected do not share the prompt's tokens")
    return {"prompt_ids": c_ids[:start],
            "chosen_ids": c_ids[start:], "chosen_mask": [int(y != IGNORE) for y in c_lab[start:]],
            "rejected_ids": r_ids[start:], "rejected_mask": [int(y != IGNORE) for y in r_lab[start:]]}


# --------------------------------------------------------------------------- TRL

def turn_masked_classes() -> tuple[type, type]:
    """The collator and trainer (built on first use: TRL imports slowly)."""
    import torch
    from trl import DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    @dataclass
    class TurnMaskCollator(DataCollatorForPreference):
        """TRL's preference collator, its completion mask multiplied by the
        pairs' own masks (0 on observations and chat headers)."""

        def torch_call(self, examples: list[dict]) -> dict:
            batch = super().torch_call(examples)
            rows = [[0] * len(e["prompt_ids"]) + list(e["chosen_mask"]) for e in examples]
            rows += [[0] * len(e["prompt_ids"]) + list(e["rejected_mask"]) for e in examples]
            keep = torch.zeros_like(batch["completion_mask"])
            for i, row in enumerate(rows):
                row = row[: self.max_length] if self.max_length is not None else row   # keep_start, as TRL cuts
                keep[i, : len(row)] = torch.tensor(row, dtype=keep.dtype)
            batch["completion_mask"] = batch["completion_mask"] * keep
            return batch

    class TurnMaskedDPOTrainer(DPOTrainer):
        """DPOTrainer on pairs tokenized by ``encode_pair`` (TRL 1.16 has no
        pre-tokenized path: its preparation would tokenize text again)."""

        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            if args.max_length is None:
                return dataset
            return dataset.filter(lambda e: len(e["prompt_ids"]) < args.max_length)   # as TRL drops them

        def _set_signature_columns_if_needed(self) -> None:
            super()._set_signature_columns_if_needed()
            self._signature_columns = [*self._signature_columns, "chosen_mask", "rejected_mask"]

    return TurnMaskCollator, TurnMaskedDPOTrainer


@dataclass
class EtoConfig(TrlKnobs, TrainSeed, StepKnobs, EtoKnobs):
    """Every knob of a DPO run: ETO's beta, learning rate and epochs
    (EtoKnobs); batch, accumulation, warm-up and MAX_LENGTH as fine-tuning
    (StepKnobs); SEED and the TRL knobs as the TRL trainer; ``--threads``."""

    threads: int = threads_setting()

    def check(self) -> None:
        check_warmup(self)

    @classmethod
    def from_knobs(cls, steps: StepKnobs, eto: EtoKnobs, seed: int = 0, trl: Optional[TrlKnobs] = None,
                   **overrides: Any) -> "EtoConfig":
        """The loop's knobs: the step knobs of its training group (its LR,
        EPOCHS and data knobs are fine-tuning's, not read here), ETO's, the
        TRL ones (else their defaults) and its seed, then ``overrides``."""
        names = {f.name for f in fields(StepKnobs)}
        values = {k: v for k, v in group_values(steps).items() if k in names}
        return cls(**{**values, **group_values(eto), **(group_values(trl) if trl else {}), "seed": seed,
                      **overrides})


def dpo_args(out: Path, cfg: EtoConfig) -> Any:
    from trl import DPOConfig

    prec = precision(cfg)
    return DPOConfig(
        output_dir=str(out / "trainer"), beta=cfg.beta, loss_type=["sigmoid"],
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.accumulative_counts,
        num_train_epochs=cfg.epochs, learning_rate=cfg.lr, lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        bf16=prec == "bf16", fp16=prec == "fp16",
        **checkpointing_kwargs(DPOConfig, cfg),
        max_length=cfg.max_length, truncation_mode="keep_start", pad_to_multiple_of=None,
        precompute_ref_log_probs=False, seed=cfg.seed, logging_steps=cfg.logging_steps,
        report_to=[] if cfg.report_to == "none" else [cfg.report_to],
        save_strategy="steps", save_steps=cfg.save_steps,
        save_total_limit=None if cfg.save_total_limit < 0 else cfg.save_total_limit,
        use_cpu=not cuda(), dataloader_num_workers=0, dataloader_pin_memory=cuda(), ddp_find_unused_parameters=False,
        disable_tqdm=True,
    )


def load_pairs(path: str) -> list[dict]:
    fix = "pass a file written by `python -m agent_r.training.eto pairs`"
    if not Path(path).is_file():
        raise UsageError(f"--pairs {path} does not exist: {fix}")
    try:
        pairs = read_json(path)
    except ValueError as exc:
        raise UsageError(f"{exc}: {fix}") from None
    if not isinstance(pairs, list) or not pairs or not all(
            isinstance(p, dict) and all(isinstance(p.get(k), list) for k in ("prompt", "chosen", "rejected"))
            for p in pairs):
        raise UsageError(f"--pairs {path}: expected a non-empty JSON list of {{prompt, chosen, rejected}}; {fix}")
    return pairs


def prepare_dpo(model_dir: str, pairs_file: str, out_dir: str, cfg: EtoConfig,
                ref_model_dir: Optional[str] = None, lora: Any = None) -> Run:
    """The DPO trainer of the run, built but not started: policy from
    ``model_dir``, frozen reference from ``ref_model_dir`` (default: the same
    weights, ETO's reference). With ``lora`` (``adapter.Lora``) only an
    adapter on ``model_dir`` trains, and the reference is ``model_dir``
    itself with the adapter switched off (TRL's way), so no second copy of
    the model is held."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    cfg.check()
    if lora is not None and ref_model_dir not in (None, model_dir):
        raise UsageError("a LoRA DPO run's reference is its start model with the adapter off: leave out "
                         "--ref_model_dir, or train without LoRA")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(out_dir)
    tokenizer = load_tokenizer(model_dir)
    fmt = ChatFormat(tokenizer)
    encoded = [e for e in (encode_pair(p, fmt, cfg.max_length) for p in load_pairs(pairs_file)) if e]
    if not encoded:
        raise UsageError(f"{pairs_file}: no pair keeps a scored token within MAX_LENGTH={cfg.max_length}")
    dataset = Dataset.from_list(encoded)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = None if lora is not None else AutoModelForCausalLM.from_pretrained(ref_model_dir or model_dir,
                                                                             dtype=torch.float32)
    collator_cls, trainer_cls = turn_masked_classes()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = collator_cls(pad_token_id=pad, max_length=cfg.max_length, truncation_mode="keep_start")
    with tensorboard_dir(out / "trainer" / "runs"):
        trainer = quiet_logs(trainer_cls(model=model, ref_model=ref, args=dpo_args(out, cfg), data_collator=collator,
                                         train_dataset=dataset, processing_class=tokenizer,
                                         peft_config=lora.peft_config() if lora is not None else None))
    tokens = sum(len(e["prompt_ids"]) * 2 + len(e["chosen_ids"]) + len(e["rejected_ids"]) for e in encoded)
    return Run(trainer, len(encoded), tokens, out, model_dir, lora)


def train_dpo(model_dir: str, pairs_file: str, out_dir: str, cfg: EtoConfig,
              ref_model_dir: Optional[str] = None, lora: Any = None) -> dict:
    """DPO from ``model_dir`` on the pairs into ``out_dir/hf`` (resumable like
    the SFT run; with ``lora``, also ``out_dir/adapter``); returns the stats,
    ``trainer: trl-dpo``."""
    cfg.check()
    key = run_key(model_dir, [pairs_file], cfg)
    key["ref_model_dir"] = str(Path(ref_model_dir or model_dir).resolve())
    stats: dict[str, Any] = {"trainer": "trl-dpo"}
    if lora is not None:
        key.update(lora_record(lora))
        stats["adapter"] = str(Path(out_dir) / "adapter")
    return train_once(Path(out_dir), key,
                      lambda: prepare_dpo(model_dir, pairs_file, out_dir, cfg, ref_model_dir, lora),
                      cfg, stats, DPO_LOGGED)


# --------------------------------------------------------------------------- commands

@dataclass
class PairsCommand(TaskChoice):
    """``python -m agent_r.training.eto pairs`` (TASK: the trees' environment,
    for its full score; unset, textcraft, as for mcts_collection.py)."""

    trees: Optional[list[str]] = setting(None, help="folders (searched recursively) or files of "
                                         "search_results_<idx>.json trees (required)")
    output: Optional[str] = setting(None, help="the JSON file of pairs to write (required)")
    full_score: Optional[float] = setting(None, help="the score of a success (default: the task's maximum)")
    max_pairs_per_tree: int = setting(1, minimum=0, help="pairs kept per tree, 0 = all (default 1, ETO's one "
                                      "failure per task)")
    extra_rounds: int = setting(5, minimum=0, help="rounds a rejected trajectory may run past the chosen one "
                                "before it is cut (default 5, ETO's)")
    seed: int = setting(0, help="the seed of the pair choice (default 0)")

    def finish(self) -> None:
        missing = [f"--{n}" for n in ("trees", "output") if not getattr(self, n)]
        if missing:
            raise UsageError(f"eto pairs needs {', '.join(missing)} (see --help)")
        self.task = self.task or DEFAULT_TASK


@dataclass
class TrainCommand(ModelDir):
    """``python -m agent_r.training.eto train`` (MODEL_DIR: the policy DPO
    starts from; unset, the bundled model as for every script)."""

    pairs: Optional[str] = setting(None, help="the pairs file of `eto pairs` (required)")
    out: Optional[str] = setting(None, help="the run's folder: hf/, loss_history.json, train_stats.json (required)")
    ref_model_dir: Optional[str] = setting(None, help="the frozen reference (default: MODEL_DIR)")
    train: EtoConfig = nested(EtoConfig)

    def finish(self) -> None:
        missing = [f"--{n}" for n in ("pairs", "out") if not getattr(self, n)]
        if missing:
            raise UsageError(f"eto train needs {', '.join(missing)} (see --help)")
        self.model_dir = self.model_dir or str(BUNDLED_MODEL_DIR)
        self.train.check()


def full_score_of(task: str) -> float:
    from agent_r.envs import get_env

    return get_env(task).max_score


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("pairs", "train"):
        raise UsageError("usage: python -m agent_r.training.eto pairs|train ... (see pairs --help, train --help)")
    if argv[0] == "pairs":
        c = parse(PairsCommand, argv[1:], description=__doc__, prog="python -m agent_r.training.eto pairs")
        full = c.full_score if c.full_score is not None else full_score_of(c.task)
        pairs = eto_pairs(c.trees, full, c.max_pairs_per_tree, c.seed, c.extra_rounds)
        atomic_write_json(c.output, pairs, indent=None)
        cut = sum(p["rejected_cut"] for p in pairs)
        print(f"wrote {len(pairs)} ETO pairs to {c.output} ({cut} rejected trajectories cut at the chosen length "
              f"+ {c.extra_rounds} rounds)")
        return 0
    t = parse(TrainCommand, argv[1:], description=__doc__, prog="python -m agent_r.training.eto train")
    stats = train_dpo(t.model_dir, t.pairs, t.out, t.train, t.ref_model_dir)
    if is_main_process():
        print(f"DPO on {stats['samples']} pairs: {stats['steps']} steps, loss {stats['first_loss']} -> "
              f"{stats['last_loss']}")
        print(f"next iteration: export MODEL_DIR={stats['hf']}")
    return 0


if __name__ == "__main__":
    run_cli(main)
