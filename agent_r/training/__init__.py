"""Fine-tuning the policy on the exported data (docs/training.md).

  settings  the training knobs both trainers honour (TrainKnobs) and the XTuner
            config's whole set (TrainSettings)
  data      the rows both trainers learn from: export files plus general data at ETA
  cpu       the in-process trainer for tiny models (TRAINER=cpu)

XTuner itself runs in its own environment (``xtuner_config/``, which imports
``settings`` and ``data`` from here; nothing in ``agent_r`` imports
``xtuner_config``). ``settings`` and ``data`` are standard-library only, so that
environment can import them; ``cpu`` imports torch and transformers when it runs.
"""
