# The file name the Agent-R reference's README trains with (`xtuner copy-cfg`
# of XTuner's llama3_8b_instruct_full_alpaca_e3). The settings live in one
# place, agent_r_llama3_8b_full.py; see docs/training.md.
from mmengine.config import read_base

with read_base():
    from .agent_r_llama3_8b_full import *  # noqa: F401,F403
