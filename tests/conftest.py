"""Shared fixtures: real local env servers (as processes on 127.0.0.1) and tiny
models built locally. Each support module owns one family of fixtures.

Property-based tests (hypothesis) run under one fixed profile: derandomized
(the same draws on every run, so CI never fails by luck), no deadline (a busy
2-core box is slow, not wrong), no example database written into the tree."""

from tests.support.env_fixtures import *  # noqa: E402,F401,F403
from tests.support.model_fixtures import *  # noqa: E402,F401,F403

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:   # tests that need it skip themselves
    pass
else:
    _hypothesis_settings.register_profile("agent-r", derandomize=True, deadline=None, database=None,
                                          print_blob=True)
    _hypothesis_settings.load_profile("agent-r")
