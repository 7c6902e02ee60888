"""Test stub: see tests/training/support/torchvision/__init__.py."""
from .functional import InterpolationMode  # noqa: F401  (transformers.image_utils imports it)


def __getattr__(name):
    raise ImportError(f"torchvision.transforms.{name} is not available in the CPU test stub")
