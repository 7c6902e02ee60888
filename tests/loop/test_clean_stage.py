"""CLEAN_PATHS=1 in the loop: the data stage exports every good path cut to
the steps its goal needs (replayed on the run's env server), records the
cleaning's counts in its done-marker, and no trained turn of the export is
one the environment refused, where the stage's own rows hold such turns."""
from __future__ import annotations

import json

from agent_r.envs import get_env
from agent_r.loop import run
from reproduction.clean_table import table
from tests.loop.conftest import FLAGS, settings_for


def refused_trained(messages: list[dict]) -> int:
    spec = get_env("textcraft")
    return sum(1 for turn, obs in zip(messages, messages[1:])
               if turn["role"] == "assistant" and turn.get("loss") and spec.refused(obs["content"]))


def test_the_data_stage_cleans_the_paths_it_exports(small_env, textcraft_server, tmp_path):
    env = {**small_env, "ITERATIONS": "1", "VARIANTS": "good", "STOP_AFTER": "data", "CLEAN_PATHS": "1"}
    result = run(settings_for(env, FLAGS + ["--min", "1", "--max", "12", "--env_server_base", textcraft_server,
                                            "--runs_dir", str(tmp_path), "--name", "clean"]))
    assert result.exit_code == 0, result.incomplete
    data = result.root / "iter_1" / "data" / "good"
    stats = json.loads((data / ".done.json").read_text())["stats"]
    report = stats["clean"]
    assert stats["clean_paths"] is True and report["rows"] > 0 and report["kept"] + report["left_out"] == report["rows"]
    rows = [json.loads(line) for line in (data / "textcraft_good.jsonl").read_text().splitlines()]
    assert sum(refused_trained(r["revise_log"]) for r in rows) == report["refused_cut"] > 0   # the searched paths
    exported = json.loads((data / "train.json").read_text())
    assert len(exported) == report["kept"]
    assert sum(refused_trained(s["messages"]) for s in exported) == 0
    assert f"| 1 | good | {report['kept']} of {report['rows']} |" in table(result.root)   # the account's table
