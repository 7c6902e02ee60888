"""Tiny-model fixtures (filled by the model backends work)."""
