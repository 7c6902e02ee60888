# Agent-R: full fine-tuning of Llama-3.1-8B-Instruct with XTuner (mmengine config).
#
#   PYTHONPATH=. DATA_FILES=train.json MODEL_DIR=/models/Llama-3.1-8B-Instruct \
#       xtuner train xtuner_config/agent_r_llama3_8b_full.py --deepspeed deepspeed_zero2
#
# or xtuner_config/train.sh, which sets PYTHONPATH and also converts the result
# to a Hugging Face model directory. Settings come from environment variables
# (agent_r/training/settings.py, docs/training.md).
# Defaults are the paper's for Llama-3.1-8B: LR 2e-5, 3% linear warm-up then cosine
# decay, batch 1 x 16 accumulation, 3 epochs in the first self-training iteration and
# 1 in later ones (iterate.py hands each iteration its EPOCHS; a run on its own takes 3).
# They are also XTuner's reference values for this model (llama3_8b_instruct_full_alpaca_e3).
#
# Data: the JSON list written by `path_collection.py export --format xtuner`,
# read through XTuner's openai_map_fn so that each assistant message's "loss"
# flag decides whether it is trained (the bad prefix of a revision sample is
# not), optionally mixed with ShareGPT-style general data (GENERAL_DATA, ETA).

from mmengine.dataset import DefaultSampler
from mmengine.hooks import (CheckpointHook, DistSamplerSeedHook, IterTimerHook, LoggerHook,
                            ParamSchedulerHook)
from mmengine.optim import AmpOptimWrapper, CosineAnnealingLR, LinearLR
from torch.optim import AdamW
from transformers import AutoModelForCausalLM, AutoTokenizer
from xtuner.dataset import process_hf_dataset
from xtuner.dataset.collate_fns import default_collate_fn
from xtuner.dataset.map_fns import openai_map_fn, template_map_fn_factory
from xtuner.engine.hooks import DatasetInfoHook
from xtuner.engine.runner import TrainLoop
from xtuner.model import SupervisedFinetune
from xtuner.utils import PROMPT_TEMPLATE

from agent_r.training.data import load_agent_r_dataset

#######################################################################
#                          Settings (env vars)                        #
#######################################################################
# mmengine parses this file lazily: the imports above are placeholders until
# the runner builds objects, so the settings are read through a plain call.
# The repository must be importable: xtuner_config/train.sh (and iterate.py,
# which runs it) put it on PYTHONPATH; with the plain `xtuner train`, set
# PYTHONPATH=<this repository> yourself.
try:
    _s = __import__("agent_r.training.settings", fromlist=["from_env"]).from_env()
except ModuleNotFoundError as _missing:
    if _missing.name != "agent_r":
        raise
    raise ModuleNotFoundError("this config imports agent_r: put the Agent-R repository on PYTHONPATH "
                              "(PYTHONPATH=/path/to/agent-r xtuner train ...), or run xtuner_config/train.sh, "
                              "which does") from None

pretrained_model_name_or_path = _s.model_dir
# The model's own chat format: PROMPT_TEMPLATE=auto (the default) picks XTuner's
# template from the model's chat template (llama3_chat for Llama-3, qwen_chat
# for ChatML models such as Qwen2.x and SmolLM2, mistral, gemma); the export
# counts tokens in the same format (agent_r.llm.chat.ChatFormat).
_template = _s.xtuner_template()
if not hasattr(__import__("xtuner.utils", fromlist=["PROMPT_TEMPLATE"]).PROMPT_TEMPLATE, _template):
    raise ValueError(f"PROMPT_TEMPLATE={_template} is not a template in xtuner.utils.PROMPT_TEMPLATE")
prompt_template = getattr(PROMPT_TEMPLATE, _template)
# XTuner cuts a longer sample from its end (the trained part of a revision
# sample): `path_collection.py export --tokenizer ...` fits samples to it first.
max_length = _s.max_length
pack_to_max_length = _s.pack

batch_size = _s.batch_size  # per device
accumulative_counts = _s.accumulative_counts
dataloader_num_workers = 0
max_epochs = _s.epochs
optim_type = AdamW
lr = _s.lr
betas = (0.9, 0.999)
weight_decay = 0
max_norm = 1  # grad clip
warmup_ratio = _s.warmup_ratio

save_steps = _s.save_steps
save_total_limit = _s.save_total_limit  # checkpoints kept (-1 = all)
work_dir = _s.work_dir

#######################################################################
#                      Model & Tokenizer                              #
#######################################################################
tokenizer = dict(
    type=AutoTokenizer.from_pretrained,
    pretrained_model_name_or_path=pretrained_model_name_or_path,
    trust_remote_code=True,
    padding_side="right",
)

model = dict(
    type=SupervisedFinetune,
    use_varlen_attn=False,
    llm=dict(
        type=AutoModelForCausalLM.from_pretrained,
        pretrained_model_name_or_path=pretrained_model_name_or_path,
        trust_remote_code=True,
    ),
)

#######################################################################
#                      Dataset & Dataloader                           #
#######################################################################
agent_r_dataset = dict(
    type=process_hf_dataset,
    dataset=dict(type=load_agent_r_dataset, data_files=_s.data_files, general_data=_s.general_data,
                 eta=_s.eta, seed=_s.seed),
    tokenizer=tokenizer,
    max_length=max_length,
    dataset_map_fn=openai_map_fn,
    template_map_fn=dict(type=template_map_fn_factory, template=prompt_template),
    remove_unused_columns=True,
    shuffle_before_pack=True,
    pack_to_max_length=pack_to_max_length,
    use_varlen_attn=False,
    map_num_proc=_s.map_num_proc,
)

train_dataloader = dict(
    batch_size=batch_size,
    num_workers=dataloader_num_workers,
    dataset=agent_r_dataset,
    sampler=dict(type=DefaultSampler, shuffle=True),
    collate_fn=dict(type=default_collate_fn, use_varlen_attn=False),
)

#######################################################################
#                      Scheduler & Optimizer                          #
#######################################################################
# Under --deepspeed, XTuner replaces this wrapper with DeepSpeed's and takes
# the optimizer, accumulation and clipping from here; precision then comes
# from the DeepSpeed JSON (bf16/fp16 "auto").
optim_wrapper = dict(
    type=AmpOptimWrapper,
    optimizer=dict(type=optim_type, lr=lr, betas=betas, weight_decay=weight_decay),
    clip_grad=dict(max_norm=max_norm, error_if_nonfinite=False),
    accumulative_counts=accumulative_counts,
    loss_scale="dynamic",
    dtype="float16",
)

# Linear warm-up over warmup_ratio of training, then cosine decay to zero.
param_scheduler = [
    dict(type=CosineAnnealingLR, eta_min=0.0, by_epoch=True, begin=warmup_ratio * max_epochs,
         end=max_epochs, convert_to_iter_based=True),
]
if warmup_ratio > 0:
    param_scheduler.insert(0, dict(type=LinearLR, start_factor=1e-5, by_epoch=True, begin=0,
                                   end=warmup_ratio * max_epochs, convert_to_iter_based=True))

train_cfg = dict(type=TrainLoop, max_epochs=max_epochs)

#######################################################################
#                           Runtime                                   #
#######################################################################
custom_hooks = [dict(type=DatasetInfoHook, tokenizer=tokenizer)]

default_hooks = dict(
    timer=dict(type=IterTimerHook),
    logger=dict(type=LoggerHook, log_metric_by_epoch=False, interval=10),
    param_scheduler=dict(type=ParamSchedulerHook),
    checkpoint=dict(type=CheckpointHook, by_epoch=False, interval=save_steps,
                    max_keep_ckpts=save_total_limit),
    sampler_seed=dict(type=DistSamplerSeedHook),
)

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
    dist_cfg=dict(backend="nccl"),
)

visualizer = None
log_level = "INFO"
load_from = None
resume = False
randomness = dict(seed=_s.seed, deterministic=False)
log_processor = dict(by_epoch=False)

del _s, _template  # helpers, not settings
