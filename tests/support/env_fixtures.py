"""Env-server fixtures (filled by the env clients/servers work)."""
