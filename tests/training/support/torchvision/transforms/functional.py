"""Test stub: see tests/training/support/torchvision/__init__.py."""
import enum


class InterpolationMode(enum.Enum):
    """Names only: transformers and xtuner reference them at import time."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"
