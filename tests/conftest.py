"""Shared fixtures: real local env servers (as processes on 127.0.0.1) and tiny
models built locally. Each support module owns one family of fixtures."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.env_fixtures import *  # noqa: E402,F401,F403
from tests.support.model_fixtures import *  # noqa: E402,F401,F403
