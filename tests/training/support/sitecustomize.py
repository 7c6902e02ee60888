"""CPU test shims for the training environment, loaded at interpreter start
because tests put this directory first on PYTHONPATH (also for the bare
``python`` that ``xtuner train`` launches). Never used on GPU machines.

* torch 2.13's ``torch.cpu`` has no ``is_bf16_supported``; XTuner calls it on
  whatever device module it detects (here ``torch.cpu``). Report False: CPU
  runs train in fp32.
* mmengine's PyTorch launcher (several ranks: torchrun) calls
  ``torch.cuda.set_device(local_rank)`` before it meets the other ranks,
  which a CPU build of torch cannot do: there it selects nothing.
"""
try:
    import torch
except ImportError:  # not the training env
    torch = None

if torch is not None and not hasattr(torch.cpu, "is_bf16_supported"):
    torch.cpu.is_bf16_supported = lambda *args, **kwargs: False

if torch is not None and not torch.cuda.is_available():
    torch.cuda.set_device = lambda *args, **kwargs: None
