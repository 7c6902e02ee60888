"""XTuner configs and their launcher (train.sh) for Agent-R training, run in the
training environment; their settings and data loaders are agent_r/training/."""
