"""iterate.py hands WAIT_REPLY to every eval it runs (the test split and the
revision task) and records it in its results. Each reply has its own eval
folders and results table in one run, so the same models are scored under
both and paired on the same revision-task rows (the env base eval's); a run
made before the folders were split stops with one line instead of mixing
both settings in one table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r.conversation import HEAD_LEN
from agent_r.loop import IterateSettings, run
from agent_r.loop.models import Policy
from agent_r.loop.stages import eval_settings
from agent_r.revision import REVISION_REPLY
from agent_r.settings import UsageError, parse
from tests.loop.conftest import SMALL, settings_for

WAIT_DOUBLE = "python:tests.loop.doubles:wait_double"
FLAGS = ["--eval_limit", "2", "--eval_max_steps", "4", "--revise_limit", "2", "--revise_max_steps", "3",
         "--max_new_tokens", "40", "--concurrency", "2"]


@pytest.mark.parametrize("env, want", [({}, "env"), ({"WAIT_REPLY": "ok"}, "ok")])
def test_every_eval_of_the_loop_gets_wait_reply(env, want, tmp_path):
    s = parse(IterateSettings, [], env)
    p = Policy("m", "m", s.backend)
    for revise_from in (None, tmp_path / "r.jsonl"):
        es = eval_settings(s, "textcraft", tmp_path, p, revise_from=revise_from)
        assert es.wait_reply == want
        assert es.run_dir().name.endswith("_wait_ok") == (want == "ok")
    assert parse(IterateSettings, ["--wait_reply", "ok"], {}).wait_reply == "ok"


def replies_after_wait(folder: Path) -> list[str]:
    """The observation after every ``wait`` turn in the eval result files under ``folder``."""
    got = []
    for path in folder.rglob("search_results_*.json"):
        state = json.loads(path.read_text())["state"]
        got += [state[i + 1]["content"] for i in range(HEAD_LEN, len(state) - 1)
                if state[i]["role"] == "assistant" and state[i]["content"].endswith("Action: wait")]
    return got


def test_a_loop_run_with_ok_answers_every_revision_wait_and_says_so(base_model, textcraft_server, tmp_path):
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "0", "BACKEND": WAIT_DOUBLE,
           "WAIT_REPLY": "ok"}
    flags = FLAGS + ["--runs_dir", str(tmp_path), "--name", "w", "--env_server_base", textcraft_server]
    result = run(settings_for(env, flags))
    assert result.exit_code == 0
    evals = tmp_path / "w" / "iter_0" / "eval_wait_ok" / "base" / "textcraft"
    folders = sorted(p.name for p in evals.iterdir() if p.is_dir())
    assert folders == ["base_test_revise_wait_ok", "base_test_wait_ok"]      # model_0 is labelled base
    replies = replies_after_wait(evals)
    assert len(replies) >= 2 and set(replies) == {REVISION_REPLY}      # none answered by the env
    for folder in folders:
        assert json.loads((evals / folder / "summary.json").read_text())["wait_reply"] == "ok"
    results = json.loads((tmp_path / "w" / "results_wait_ok.json").read_text())
    assert results["wait_reply"] == "ok" and results["config"]["wait_reply"] == "ok"
    (row,) = results["rows"]
    assert row["wait_reply"] == "ok"
    assert row["test"]["textcraft"]["revision_turns"]["episodes"] == 2   # both test episodes revised once
    assert "WAIT_REPLY=ok" in (tmp_path / "w" / "results_wait_ok.md").read_text()
    assert not (tmp_path / "w" / "results.json").exists() and not (tmp_path / "w" / "iter_0" / "eval").exists()

    # the same run again resumes; with the env's reply it runs the env evals beside, into their own folders
    assert run(settings_for(env, flags)).rows == result.rows
    env_run = run(settings_for({**env, "WAIT_REPLY": "env"}, flags))
    assert env_run.exit_code == 0
    env_evals = tmp_path / "w" / "iter_0" / "eval" / "base" / "textcraft"
    assert sorted(p.name for p in env_evals.iterdir() if p.is_dir()) == ["base_test", "base_test_revise"]
    assert set(replies_after_wait(env_evals)) - {REVISION_REPLY}     # the env answered these
    assert json.loads((tmp_path / "w" / "results.json").read_text())["rows"][0]["wait_reply"] == "env"
    assert json.loads((tmp_path / "w" / "results_wait_ok.json").read_text())["rows"] == results["rows"]


def test_an_ok_run_reads_the_revision_rows_of_the_env_base_eval(base_model, textcraft_server, tmp_path):
    """Both replies continue the same cut episodes: an ok eval made after the
    env base eval reads that eval's rows, not rows cut from its own failures."""
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "0", "BACKEND": WAIT_DOUBLE}
    flags = FLAGS + ["--runs_dir", str(tmp_path), "--name", "w", "--env_server_base", textcraft_server]
    assert run(settings_for(env, flags)).exit_code == 0
    rows = tmp_path / "w" / "iter_0" / "eval" / "base" / "revise_tasks_textcraft.jsonl"
    marked = [json.loads(line) for line in rows.read_text().splitlines()]
    kept = marked[:1]                                    # one row only: the ok eval must take exactly these
    rows.write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert run(settings_for({**env, "WAIT_REPLY": "ok"}, flags)).exit_code == 0
    ok_base = tmp_path / "w" / "iter_0" / "eval_wait_ok" / "base"
    assert not (ok_base / "revise_tasks_textcraft.jsonl").exists()
    summary = json.loads((ok_base / "textcraft" / "base_test_revise_wait_ok" / "summary.json").read_text())
    assert summary["tasks"] == len(kept) == 1


def test_a_run_whose_eval_folder_holds_ok_evals_stops_with_the_move_to_make(base_model, textcraft_server, tmp_path):
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "0", "BACKEND": WAIT_DOUBLE,
           "WAIT_REPLY": "ok"}
    flags = FLAGS + ["--runs_dir", str(tmp_path), "--name", "w", "--env_server_base", textcraft_server]
    assert run(settings_for(env, flags)).exit_code == 0
    root = tmp_path / "w" / "iter_0"
    (root / "eval_wait_ok").rename(root / "eval")          # what a run made before the split looks like
    with pytest.raises(UsageError, match="holds an eval with WAIT_REPLY=ok.*move iter_<k>/eval/ .* to "
                                         "iter_<k>/eval_wait_ok/"):
        run(settings_for({**env, "WAIT_REPLY": "env"}, flags))


def test_tagged_evals_keep_their_own_folders_and_table_and_the_runs_revision_rows(base_model, textcraft_server,
                                                                                 tmp_path):
    """EVAL_TAG: the same run's models scored again under other conditions
    (another dtype or machine) never mix with the run's own evals."""
    env = {**SMALL, "TASK": "textcraft", "MODEL_DIR": base_model, "ITERATIONS": "0", "BACKEND": WAIT_DOUBLE}
    flags = FLAGS + ["--runs_dir", str(tmp_path), "--name", "w", "--env_server_base", textcraft_server]
    own = run(settings_for(env, flags))
    rows = tmp_path / "w" / "iter_0" / "eval" / "base" / "revise_tasks_textcraft.jsonl"
    rows.write_text(rows.read_text().splitlines()[0] + "\n")            # one row: the tagged evals must read it
    for reply in ("env", "ok"):
        tagged = run(settings_for({**env, "EVAL_TAG": "fp32", "WAIT_REPLY": reply}, flags))
        assert tagged.exit_code == 0
        suffix = "_fp32" + ("_wait_ok" if reply == "ok" else "")
        folder = tmp_path / "w" / "iter_0" / f"eval{suffix}" / "base"
        assert not (folder / "revise_tasks_textcraft.jsonl").exists()
        revise = next((folder / "textcraft").glob("*_revise*"))
        assert json.loads((revise / "summary.json").read_text())["tasks"] == 1
        assert (tmp_path / "w" / f"results{suffix}.json").exists()
    assert json.loads((tmp_path / "w" / "results.json").read_text())["rows"] == json.loads(
        json.dumps(own.rows))                                            # the run's own table untouched
    with pytest.raises(UsageError, match="EVAL_TAG='a/b' names a folder"):
        run(settings_for({**env, "EVAL_TAG": "a/b"}, flags))
