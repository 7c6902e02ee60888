# CPU test config: the shipped config, changed only where CPU forces it.
# The tiny model, the data and WARMUP_RATIO=0 (a warm-up over a few steps rounds
# to zero iterations) come from environment variables, as in any user's run.
from mmengine.config import read_base

with read_base():
    from ...xtuner_config.agent_r_llama3_8b_full import *  # noqa: F401,F403

from mmengine.optim import OptimWrapper

# AmpOptimWrapper needs CUDA: train in fp32 with the same optimizer settings.
optim_wrapper = dict(
    type=OptimWrapper,
    optimizer=optim_wrapper.optimizer,  # noqa: F405
    clip_grad=optim_wrapper.clip_grad,  # noqa: F405
    accumulative_counts=optim_wrapper.accumulative_counts,  # noqa: F405
)

# Several ranks (torchrun) meet over a process group: NCCL needs GPUs, gloo runs on CPU.
env_cfg = dict(env_cfg, dist_cfg=dict(backend="gloo"))  # noqa: F405
