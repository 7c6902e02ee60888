"""Fixtures of the command-line tests: a TextCraft server a test may kill."""
from tests.servers.killable import own_server  # noqa: F401
