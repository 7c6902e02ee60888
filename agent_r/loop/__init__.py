"""Agent-R's self-training loop behind ``iterate.py`` (docs/iterate.md).

For k = 1..ITERATIONS and each variant, with policy model_{k-1}
(model_0 = MODEL_DIR): search the train split, build revision data
(``agent-r``: the policy finds the first bad step; ``direct``: the whole bad
path is the prefix; ``good``: good paths only) and good data, export one XTuner
file (all tasks pooled), fine-tune (``eto``: ETO's success/failure pairs and
DPO instead), and evaluate model_k on every task's test
split and on the revision task. Iteration 0 is the base model's evaluation.

ALPHA and EPOCHS may differ per iteration (the paper's 0.5/0.7/1.0 and
3/1/1 by default). Which model iteration k starts from: model_{k-1}, fine-tuned on the data its
own search produced (``TRAIN_FROM=previous``, the default): each iteration
trains only on new data and the policy that made the data is the one that
learns from it. ``TRAIN_FROM=base`` instead fine-tunes the base model on the
data of iterations 1..k pooled, which cannot drift further from the base than
one training run but costs k times the training.

  settings     IterateSettings: the loop's own settings, the stages' knob groups nested
  models       the model each stage uses; one live backend at a time
  stages       done-markers; the search, data and eval stages
  train        which trainer; XTuner as a subprocess
  trl_stages   TRAINER=trl, and the eto variant's data and train stages
  revise_task  the revision task's episodes: the base model's failures, cut at a random step
  search_tasks the base model's own training tasks left out of the search
  stats        paired comparisons (McNemar's exact test) and revision-turn counts
  results      results.json / .md / .png
  runner       the whole run (``run``)

Where a run's files go (``Layout``, ``runs/<name>/iter_<k>/...``) is named in
agent_r/paths.py with every other artefact.
"""
from agent_r.loop.runner import LoopResult, run
from agent_r.loop.settings import IterateSettings

__all__ = ["IterateSettings", "LoopResult", "run"]
