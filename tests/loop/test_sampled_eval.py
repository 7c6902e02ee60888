"""EVAL_SAMPLES in the loop: a sampled eval of every model beside the greedy
one (its own stage and folder), Pass@1 and Pass@K in results.json/md/png;
off by default, and a greedy sampled eval is refused in seconds."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from agent_r.loop import IterateSettings, run
from agent_r.settings import UsageError, parse
from tests.loop.conftest import FLAGS, settings_for


def test_the_loop_adds_pass_at_k_beside_the_greedy_eval(small_env, textcraft_server, tmp_path):
    env = {**small_env, "ITERATIONS": "1", "VARIANTS": "agent-r", "EVAL_SAMPLES": "3"}
    flags = FLAGS + ["--runs_dir", str(tmp_path), "--name", "s", "--env_server_base", textcraft_server]
    result = run(settings_for(env, flags))
    assert result.exit_code == 0
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["rows"]
    assert [(r["iteration"], r["variant"]) for r in rows] == [(0, "base"), (1, "agent-r")]
    for r in rows:
        got = r["sampled"]
        assert (got["samples"], got["temperature"]) == (3, 1.0)
        test = got["test"]["textcraft"]
        assert (test["tasks"], test["episodes"]) == (3, 9) and set(test["pass_at_k"]) == {"1", "2", "3"}
        assert all(c["episodes"] == 3 for c in test["per_task"].values())
        assert r["test"]["textcraft"]["tasks"] == 3            # the greedy eval is still there
    folder = tmp_path / "s" / "iter_1" / "eval" / "agent-r" / "sampled" / "textcraft"
    assert [p.name for p in folder.iterdir()] == ["agent-r-iter1_test_samples3"]
    md = (tmp_path / "s" / "results.md").read_text()
    assert "Pass@k: 3 episodes per test task at TEMP=1" in md and "textcraft pass@3 - base (paired)" in md
    numbers = json.loads(Image.open(tmp_path / "s" / "results.png").info["Description"])
    assert "textcraft pass@3 % (TEMP=1)" in numbers
    again = run(settings_for(env, flags))          # every stage is read back, nothing reruns
    assert again.exit_code == 0 and json.loads((tmp_path / "s" / "results.json").read_text())["rows"][1][
        "sampled"] == rows[1]["sampled"]


def test_off_by_default_and_greedy_sampling_is_refused():
    assert parse(IterateSettings, [], {}).eval_samples == 1
    with pytest.raises(UsageError, match="EVAL_SAMPLE_TEMP=0 is greedy"):
        parse(IterateSettings, [], {"EVAL_SAMPLES": "4", "EVAL_SAMPLE_TEMP": "0"}).finish()
