"""Fine-tuning the policy on the exported data (docs/training.md).

  settings  the training knobs every trainer honours (TrainKnobs), the XTuner
            config's whole set (TrainSettings), the TRL-only and ETO knobs
  data      the rows the trainers learn from: export files plus general data at ETA
  cpu       the in-process trainer for tiny models (TRAINER=cpu)
  trl_sft   TRL's SFTTrainer with XTuner's labels (TRAINER=trl; accelerate/torchrun)
  resume    the TRL runs' folder: run key, resuming a killed run, saving hf/
  eto       ETO: success/failure pairs from the trees and DPO with TRL (the eto variant)

XTuner itself runs in its own environment (``xtuner_config/``, which imports
``settings`` and ``data`` from here; nothing in ``agent_r`` imports
``xtuner_config``). ``settings`` and ``data`` are standard-library only, so that
environment can import them; ``cpu``, ``trl_sft``, ``resume`` and ``eto``
import torch, transformers and TRL when they run.
"""
