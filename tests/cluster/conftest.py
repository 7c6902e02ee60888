"""Fixtures of the cluster tests: a real SLURM on 127.0.0.1 for the module
(tests/support/slurm_cluster.py), skipped with the one-line fix where it
cannot start (failed under CI=true, where `make test` installs it)."""
from __future__ import annotations

import os

import pytest

from tests.support import slurm_cluster
from tests.training.conftest import agent_export  # noqa: F401 - the training tests' export, for train.sbatch


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = slurm_cluster.missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests (make test runs make setup-slurm): {reason}")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    try:
        yield slurm_cluster.start(folder)
    finally:
        slurm_cluster.stop(folder)
