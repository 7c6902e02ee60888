"""Test stand-in (a stub, not torchvision) for the CPU test environment only.

PyPI's torchvision wheel is built against CUDA torch and fails to import next
to the CPU torch 2.13.0 (``operator torchvision::nms does not exist``), yet
``xtuner.dataset`` imports it for its vision datasets. Text-only training
never calls it, so this package (first on PYTHONPATH in tests) only has to
import; any real use raises.
"""
__version__ = "0.0.0+stub"


def __getattr__(name):
    raise ImportError(f"torchvision.{name} is not available: this is the CPU test stub "
                      "(tests/training/support/torchvision); install a torchvision matching your torch")
