"""SPEC sections 2 and 5 promises about evaluation that no other test pins,
through the library entry point (agent_r.evaluation.evaluate) with settings
parsed exactly as eval.py parses them, on the real local TextCraft server:
every prompt is truncated to MAX_TOKEN_LENGTH - 60 (oldest pairs first, the
stored trajectory whole), TEMP reaches the sampler, and an episode runs 100
model steps unless --max_steps says otherwise."""
from __future__ import annotations

import json

from agent_r.conversation import TRUNCATION_MARGIN, initial_conversation
from agent_r.evaluation import EvalSettings, evaluate
from agent_r.settings import parse
from tests.support.doubles import ScriptedBackend

WORDY = "Thought: " + "I keep checking what I carry " * 4 + "\nAction: inventory"


def settings_for(tmp_path, server: str, *flags: str, **env: str) -> EvalSettings:
    return parse(EvalSettings, ["--env_server_base", server, "--output_dir", str(tmp_path), "--model_name", "m",
                                "--limit", "1", *flags], {"TASK": "textcraft", **env})


def results(run) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run.run_dir.glob("search_results_*.json"))]


def test_eval_prompt_is_truncated_to_max_token_length(tmp_path, textcraft_server):
    """Each request is the conversation so far with the oldest
    (turn, observation) pairs after message 3 dropped - just enough of them to
    fit MAX_TOKEN_LENGTH - 60 tokens (the backend's count), never the newest."""
    probe = ScriptedBackend(lambda m, i, s: WORDY)
    from agent_r import envs

    with envs.get_env("textcraft").make_client(textcraft_server) as client:
        client.reset(envs.get_env("textcraft").split_indices("test", server=textcraft_server)[0])
        head = probe.count_tokens(initial_conversation(client.instruction, client.observe()))
    budget_pairs = 3
    pair = len(WORDY.split()) + len("Inventory: You are not carrying anything.".split())
    max_len = head + TRUNCATION_MARGIN + budget_pairs * pair + pair // 2
    backend = ScriptedBackend(lambda m, i, s: WORDY)
    run = evaluate(settings_for(tmp_path, textcraft_server, "--max_steps", "8", MAX_TOKEN_LENGTH=str(max_len)),
                   backend)
    (result,) = results(run)
    state = result["state"]
    assert len(state) == 4 + 2 * 8                           # the stored trajectory keeps every turn
    sent = [r.messages for b in backend.batches for r in b.requests]
    assert len(sent) == 8
    budget = max_len - TRUNCATION_MARGIN
    for step, messages in enumerate(sent):
        full = state[:4 + 2 * step]                          # what the model would see untruncated
        kept = (len(messages) - 4) // 2
        assert [{"role": m["role"], "content": m["content"]} for m in messages] == full[:4] + full[len(full) - 2 * kept:]
        assert kept == min(step, budget_pairs)               # as many pairs as fit, and no fewer
        assert backend.count_tokens(messages) <= budget or kept == 1
    assert max(len(m) for m in sent) < len(state) - 2        # truncation really happened


def test_temp_reaches_the_sampler_in_eval(tmp_path, textcraft_server):
    backend = ScriptedBackend(lambda m, i, s: "Thought: look.\nAction: inventory")
    evaluate(settings_for(tmp_path, textcraft_server, "--max_steps", "3", TEMP="0.35"), backend)
    assert backend.batches and {b.sampling.temperature for b in backend.batches} == {0.35}


def test_eval_runs_100_model_steps_by_default(tmp_path, textcraft_server):
    settings = settings_for(tmp_path, textcraft_server)
    assert settings.max_steps == 100
    backend = ScriptedBackend(lambda m, i, s: "Thought: look.\nAction: inventory")
    (result,) = results(evaluate(settings, backend))
    assert (result["ended_by"], result["step_num"], result["model_steps"]) == ("step_limit", 100, 100)
    assert backend.stats.requests == 100
