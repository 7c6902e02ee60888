"""eval.py as a user runs it: the tiny real model end to end (batched, one
result file per test task, the summary), settings flag over env var over
default with the reference's defaults, one-line exit 2 for bad input or an
unreachable server, and every setting in --help."""
import json

import pytest

from agent_r import evaluation as ev
from agent_r import paths
from agent_r.envs import get_env
from agent_r.settings import UsageError
from tests.support.eval_runs import run_eval


def test_tiny_model_hf_backend_end_to_end(tmp_path, tiny_model_dir, textcraft_server):
    out = tmp_path / "out"
    proc = run_eval(["--env_server_base", textcraft_server, "--backend", "hf", "--limit", "3",
                     "--max_steps", "2", "--max_new_tokens", "16", "--output_dir", str(out), "--concurrency", "3"],
                    env={"TASK": "textcraft", "MODEL_DIR": tiny_model_dir, "MODEL_NAME": "tiny", "TEMP": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = out / "textcraft" / "tiny_eval"
    expected = get_env("textcraft").split_indices("test")[:3]
    files = sorted(run_dir.glob("search_results_*.json"))
    assert sorted(int(p.stem.rsplit("_", 1)[1]) for p in files) == sorted(expected)
    results = [json.loads(p.read_text()) for p in files]
    for r in results:
        assert r["model_name"] == "tiny" and r["task_id"] in expected
        assert 1 <= r["step_num"] <= 2 and len(r["state"]) == 4 + 2 * r["step_num"]
        assert r["ended_by"] in ("done", "step_limit", "disaster")
        assert r["state"][3]["content"].startswith("Crafting commands:")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"] == 3
    assert summary["mean_steps"] == pytest.approx(sum(r["step_num"] for r in results) / 3)
    assert summary["score_x100"] == pytest.approx(100 * sum(r["env_score"] for r in results) / 3)
    assert summary["step_limit"] == sum(r["ended_by"] == "step_limit" for r in results)
    # batched: one generate call per round for all live episodes, not one per task
    assert summary["backend_stats"]["calls"] == max(r["model_steps"] for r in results)
    assert summary["backend_stats"]["requests"] == sum(r["model_steps"] for r in results)
    assert "score x100" in proc.stdout and "tiny_eval" in proc.stdout


@pytest.mark.parametrize("env,args,message", [
    ({"TASK": "minecraft"}, [], "unknown TASK='minecraft'"),
    ({"TASK": "textcraft"}, ["--split_file", "/nonexistent/split.json"], "split file /nonexistent/split.json does not exist"),
    ({"TASK": "webshop"}, ["--split", "project"], "--split='project' is not a webshop split"),
    ({"TASK": "textcraft"}, ["--max_steps", "0"], "--max_steps=0 is too small"),
    ({"TASK": "textcraft"}, ["--limit", "0"], "--limit=0 is too small"),
    ({"TASK": "textcraft", "TEMP": "hot"}, [], "TEMP='hot' is not a number"),
    ({"TASK": "textcraft", "MAX_TOKEN_LENGTH": "99"}, [], "MAX_TOKEN_LENGTH=99 is too small"),
    ({"TASK": ""}, [], "environment variable TASK is not set"),
])
def test_bad_input_is_one_line_exit_2(env, args, message):
    proc = run_eval(args, env={"MODEL_DIR": "/nonexistent-model", **env})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_unreachable_server_is_one_line_exit_2(tmp_path):
    from tests.support.env_fixtures import free_port

    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"default": ["Action: inventory"]}))
    proc = run_eval(["--env_server_base", f"http://127.0.0.1:{free_port()}", "--limit", "1",
                     "--backend", "python:tests.support.doubles:table_backend", "--output_dir", str(tmp_path)],
                    env={"TASK": "textcraft", "MODEL_DIR": str(table)})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "127.0.0.1" in lines[0], proc.stderr


def test_help_lists_every_setting():
    from agent_r.evaluation import EvalSettings
    from agent_r.knobs import BackendSettings
    from dataclasses import fields

    proc = run_eval(["--help"])
    assert proc.returncode == 0
    for cls in (EvalSettings, BackendSettings):
        for f in fields(cls):
            if f.metadata.get("nested"):
                continue
            flag = f.metadata["flag"]
            names = [f"--{f.name}" if flag is True else flag, f.metadata["env"]]
            assert any(n and n in proc.stdout for n in names), f.name
    for name in ("TASK", "MODEL_TYPE", "TEMP", "MAX_TOKEN_LENGTH", "MODEL_DIR", "MODEL_NAME", "BACKEND",
                 "--env_server_base", "--model_name", "--max_steps", "--split_file", "--output_dir", "--concurrency",
                 "--seed", "--backend", "--max_new_tokens", "--limit", "--compare", "--revise_from",
                 "--env_retries", "--env_retry_delay"):
        assert name in proc.stdout, name


def test_settings_resolve_flag_over_env_over_default(tmp_path):
    from agent_r.settings import manifest_config, parse

    environ = {"TASK": "textcraft", "MODEL_NAME": "from-env", "MODEL_TYPE": "iter1", "TEMP": "0",
               "MAX_TOKEN_LENGTH": "2048", "OPENAI_API_KEY": "sk-secret"}
    s = parse(ev.EvalSettings, ["--model_name", "from-flag", "--limit", "3", "--output_dir", str(tmp_path)], environ)
    assert (s.model_name, s.model_type, s.temperature, s.max_token_length, s.limit) == \
        ("from-flag", "iter1", 0.0, 2048, 3)
    assert (s.max_steps, s.concurrency, s.max_new_tokens, s.env_retries, s.env_retry_delay) == (100, 8, 500, 2, 1.0)
    assert paths.eval_dir(s) == tmp_path / "textcraft" / "from-flag_iter1"
    config = s.run_config()
    assert config["backend"]["openai_api_key"] == "***" and config["model_name"] == "from-flag"
    assert set(manifest_config(s)) - {"eval_samples"} <= set(config)   # one episode a task: the files of old
    assert "eval_samples" not in config

    s = parse(ev.EvalSettings, ["--revise_from", "x.jsonl"], {"TASK": "textcraft", "MODEL_DIR": "/m/iter2/"})
    assert paths.eval_dir(s).name == "iter2_eval_revise"
    compare = parse(ev.EvalSettings, ["--compare", "a", "b"], {})   # no TASK needed to compare
    assert compare.compare == ["a", "b"] and compare.task is None
    with pytest.raises(UsageError, match="TASK is not set"):
        parse(ev.EvalSettings, [], {})


def test_eval_defaults_follow_the_reference():
    """The reference's defaults: 100 steps per episode, prompts truncated at 7000 tokens, TEMP 1.0."""
    from agent_r.settings import parse

    s = parse(ev.EvalSettings, [], {"TASK": "textcraft"})
    assert (s.max_steps, s.max_token_length, s.temperature) == (100, 7000, 1.0)
