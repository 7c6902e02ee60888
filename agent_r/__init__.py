"""Agent-R: MCTS trajectory search, model-guided revision data and evaluation
for LLM agents in AgentGym environments.

One concept per module (docs/architecture.md):
  settings       every script setting: env var, flag, help, validation; exit codes
  knobs          the knob groups several scripts share, each env var declared once
  envs/          everything that differs between TextCraft, SciWorld, WebShop
  conversation   message layout, action parsing, truncation
  tree           MCTS node, its exact JSON schema, leaf paths
  llm            model backends (vllm, openai, hf) behind one interface
  driver         the one batch driver for env-bound jobs (trees, episodes)
  paths          every artefact's path and name (trees, episodes, revision JSONL, caches)
  mcts           MCTS of one task as a driver job (no files)
  search         the mcts_collection run: task selection, resume, tree files
  verifier       the verifier prompt, judgement parsing, batched judging
  revision       pairing leaf paths, splicing revision trajectories
  revision_data  the path_collection run: part cache, batched verifier, JSONL
  export         XTuner / DPO training files
  clean          clean continuations: trained paths replayed and cut to the steps the goal needs
  episode        an eval episode as a driver job
  evaluation     the eval run: resume, result files, summary
  report         eval summaries and the side-by-side compare table
  provenance     what made an eval's numbers: recorded, read back, compared
  sharding       data-parallel shards: which tasks a process takes, per-shard manifests
  loop/          iterate.py's self-training loop: stages, models, shards per GPU group, results
  training/      the training knobs, the rows every trainer learns from, the CPU, TRL and ETO trainers
  manifest, io   run manifests; atomic writes
"""

__version__ = "0.1.0"
