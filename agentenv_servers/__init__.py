"""Local AgentGym-compatible environment servers (FastAPI + uvicorn).

``python -m agentenv_servers.textcraft --port 36001`` and
``python -m agentenv_servers.sciworld --port 36002``; the pure TextCraft game
(no HTTP) is ``agentenv_servers.textcraft_env.TextCraftGame``.
"""
