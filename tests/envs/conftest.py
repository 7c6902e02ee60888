"""Fixtures of the environment tests: a server that answers only / and /identity."""
from tests.envs.doubles import fake_server  # noqa: F401
