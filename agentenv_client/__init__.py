"""HTTP clients for AgentGym environment servers (the 2024 client interface the
Agent-R scripts used), with bounded retries and errors that name the server."""
from agentenv_client.base import EnvClientUsageError, EnvServerError, EnvServerUnreachable, StepOutput, load_instruction
from agentenv_client.sciworld import SciworldEnvClient
from agentenv_client.textcraft import TextCraftEnvClient
from agentenv_client.webshop import WebshopEnvClient

__all__ = ["EnvClientUsageError", "EnvServerError", "EnvServerUnreachable", "StepOutput", "load_instruction",
           "SciworldEnvClient", "TextCraftEnvClient", "WebshopEnvClient"]
