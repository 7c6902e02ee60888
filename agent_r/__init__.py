"""Agent-R: MCTS trajectory search, model-guided revision data and evaluation
for LLM agents in AgentGym environments.

One concept per module:
  conversation  message layout, action parsing, truncation
  tree          MCTS node, its exact JSON schema, leaf paths
  search        batched MCTS over many trees at once
  llm           model backends (vllm, openai, hf) behind one interface
  tasks         everything that differs between TextCraft, SciWorld, WebShop
  revision      pairing leaf paths, verifier, splicing revision trajectories
  export        XTuner / DPO training files
  evaluation    test-split episodes and the aggregate report
  config        environment-variable parsing with helpful errors
  io            atomic writes and resumable outputs
"""

__version__ = "0.1.0"
