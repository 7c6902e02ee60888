"""XTuner configs and helpers for Agent-R training (run in the training env)."""
