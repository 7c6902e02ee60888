"""A short soak of the local TextCraft server (bench/bench_soak.py): many
concurrent create/reset/step/close cycles leave no live env, and its memory
and open files stay bounded."""
from __future__ import annotations

import json

from tests.support.faults import run_script


def test_short_soak_keeps_server_memory_and_fds_bounded(tmp_path, own_server):
    """bench/bench_soak.py for a few seconds at concurrency 16: no env left
    live, RSS and open fds stay near their start values."""
    out = tmp_path / "soak.json"
    res = run_script("bench/bench_soak.py", "--server_url", own_server["url"], "--server_pid", own_server["proc"].pid,
                     "--seconds", "8", "--concurrency", "16", "--json", out)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["cycles"] > 100 and data["errors"] == 0
    assert data["end"]["live_envs"] == 0
    assert data["end"]["rss_kib"] - data["start"]["rss_kib"] < 30 * 1024
    assert data["end"]["fds"] - data["start"]["fds"] <= 4
