"""WAIT_REPLY: who answers the revision turn's ``wait`` in eval. Training
samples follow it with ``ok.``; the real TextCraft server answers it with
"Could not execute wait". With ``ok`` the episode answers it itself (the env
never sees it, the model's next prompt holds the training reply, the turn
still counts); with ``env`` (the default) nothing changes. The two settings
write to two folders, and the summary says which one ran and how many
episodes held a revision turn."""
from __future__ import annotations

import json

import pytest

from agent_r import conversation as conv
from agent_r import evaluation as ev
from agent_r import paths
from agent_r.envs import get_env
from agent_r.revision import REVISION_REPLY, REVISION_THOUGHTS, is_revision_turn, is_revision_wait
from agent_r.settings import UsageError, parse
from tests.support.doubles import ScriptedBackend
from tests.support.eval_runs import config, model_turns, read_results, split_file

REVISE = f"Thought: {REVISION_THOUGHTS[0]}\nAction: wait"
PLAIN_WAIT = "Thought: hmm.\nAction: wait"     # a wait without a revision thought: still the revision wait here
LOOK = "Thought: look.\nAction: inventory"
TURNS = [LOOK, REVISE, LOOK, PLAIN_WAIT, LOOK]
# each episode: one revision sentence and one bare wait (docs/evaluation.md, "Revision turns, two kinds")
KINDS = {"sentence": {"episodes": 2, "succeeded": 0, "turns": 2}, "bare_wait": {"episodes": 2, "succeeded": 0, "turns": 2},
         "ten_or_more": 0}


class RecordingClient:
    """Test double around a real env client: records every action sent."""

    def __init__(self, real, sent: list[str]):
        self.real, self.sent = real, sent

    def __getattr__(self, name):
        return getattr(self.real, name)

    def step(self, action):
        self.sent.append(action)
        return self.real.step(action)


def run(tmp_path, server, wait_reply: str | None, tasks=(0, 1), turns=TURNS):
    """A run of ``turns`` per episode; (the run, actions the env got, prompts the model got)."""
    sent: list[str] = []
    prompts: list[list[dict]] = []

    def policy(messages, i, seed):
        prompts.append(messages)
        return turns[model_turns(messages)]

    extra = {} if wait_reply is None else {"wait_reply": wait_reply}
    cfg = config(tmp_path, server, split_file(tmp_path, list(tasks)), max_steps=len(turns), **extra)
    rules = get_env("textcraft")
    new_client = lambda: RecordingClient(rules.make_client(server), sent)  # noqa: E731
    done = ev.evaluate(cfg, ScriptedBackend(policy), new_client=new_client)
    return cfg, done, sent, prompts


def after(state: list[dict], turn: str) -> list[str]:
    """The observations that followed ``turn`` in a stored trajectory."""
    return [state[i + 1]["content"] for i in range(conv.HEAD_LEN, len(state) - 1)
            if state[i]["role"] == "assistant" and state[i]["content"] == turn]


def test_ok_answers_the_revision_wait_with_the_training_reply(tmp_path, textcraft_server):
    cfg, done, sent, prompts = run(tmp_path, textcraft_server, "ok")
    assert sent and "wait" not in sent and set(sent) == {"inventory"}      # the env never got a wait
    assert len(sent) == 2 * 3                                              # 3 of 5 turns per episode reached it
    # the prompt after each wait ends with the training samples' reply, as in a training sample
    for p in prompts:
        if p[-2]["role"] == "assistant" and p[-2]["content"].endswith("Action: wait"):
            assert p[-1] == {"role": "user", "content": REVISION_REPLY}
    assert sum(1 for p in prompts if p[-1]["content"] == REVISION_REPLY) == 2 * 2
    for r in read_results(cfg).values():
        assert after(r["state"], REVISE) == after(r["state"], PLAIN_WAIT) == [REVISION_REPLY]
        # the local turns count as turns: toward the turn limit, in step_num and in the trajectory
        assert (r["model_steps"], r["step_num"], r["ended_by"], r["wait_replies"]) == (5, 5, "step_limit", 2)
        assert len(r["state"]) == conv.HEAD_LEN + 2 * 5
    assert done.run_dir == paths.eval_dir(cfg) and done.run_dir.name == "scripted_eval_wait_ok"
    summary = json.loads((done.run_dir / "summary.json").read_text())
    assert summary["wait_reply"] == "ok" and summary["config"]["wait_reply"] == "ok"
    assert summary["revision_turns"] == {"episodes": 2, "succeeded": 0, "once": 0, "turns": 4, "wait_replies": 4,
                                        **KINDS,
                                        "after": {"inventory": 4}}   # each wait: an inventory next
    manifest = json.loads((done.run_dir / "manifest.json").read_text())
    assert manifest["config"]["wait_reply"] == "ok"


def test_env_default_sends_the_wait_to_the_env_as_before(tmp_path, textcraft_server):
    cfg, done, sent, prompts = run(tmp_path, textcraft_server, None)
    assert cfg.wait_reply == "env"
    assert sent.count("wait") == 2 * 2 and len(sent) == 2 * 5
    for r in read_results(cfg).values():
        (answer,) = after(r["state"], REVISE)
        assert answer == "Could not execute wait" and after(r["state"], PLAIN_WAIT) == [answer]
        assert (r["model_steps"], r["step_num"], r["wait_replies"]) == (5, 5, 0)
    assert not any(p[-1]["content"] == REVISION_REPLY for p in prompts)
    assert done.run_dir.name == "scripted_eval"                     # the default folder keeps its name
    summary = json.loads((done.run_dir / "summary.json").read_text())
    assert summary["wait_reply"] == "env"
    assert summary["revision_turns"] == {"episodes": 2, "succeeded": 0, "once": 0, "turns": 4, "wait_replies": 0,
                                        **KINDS,
                                        "after": {"inventory": 4}}   # each wait: an inventory next


def test_both_settings_on_one_model_keep_their_own_folders(tmp_path, textcraft_server):
    env_cfg, env_run, _, _ = run(tmp_path, textcraft_server, "env")
    ok_cfg, ok_run, _, _ = run(tmp_path, textcraft_server, "ok")
    assert env_run.run_dir != ok_run.run_dir and env_run.run_dir.parent == ok_run.run_dir.parent
    assert ok_run.ran == 2 and ok_run.skipped == 0                  # nothing resumed from the env run
    # each folder holds only its own setting's episodes
    assert all(r["wait_replies"] == 0 for r in read_results(env_cfg).values())
    assert all(r["wait_replies"] == 2 for r in read_results(ok_cfg).values())
    revise = parse(ev.EvalSettings, ["--revise_from", "x.jsonl", "--wait_reply", "ok"], {"TASK": "textcraft"})
    assert paths.eval_dir(revise).name.endswith("_eval_revise_wait_ok") and revise.run_dir() == paths.eval_dir(revise)


def test_ok_also_answers_a_wait_in_a_replayed_prefix(tmp_path, textcraft_server):
    """The revision task replays a failed prefix: a revision wait in it is
    answered the same way, so the model sees one reply for it throughout."""
    prefix = conv.initial_conversation("instr", "obs")
    for turn in (LOOK, REVISE):
        prefix = conv.append_turn(prefix, turn, "stored")
    rows = tmp_path / "low.jsonl"
    rows.write_text(json.dumps({"task_num": 2, "low_log": prefix}) + "\n")
    sent: list[str] = []
    cfg = config(tmp_path, textcraft_server, None, revise_from=str(rows), max_steps=2, wait_reply="ok")
    rules = get_env("textcraft")
    ev.evaluate(cfg, ScriptedBackend(lambda m, i, s: LOOK),
                new_client=lambda: RecordingClient(rules.make_client(textcraft_server), sent))
    assert sent == ["inventory", "inventory", "inventory"]
    (r,) = read_results(cfg).values()
    assert after(r["state"], REVISE) == [REVISION_REPLY]
    assert (r["replayed_steps"], r["model_steps"], r["step_num"], r["wait_replies"]) == (2, 2, 4, 1)


def test_in_sciworld_only_a_wait_under_a_revision_thought_is_the_revision_wait():
    """``wait`` is a SciWorld game action: the game's own wait still reaches the game."""
    assert is_revision_wait(PLAIN_WAIT, "textcraft") and is_revision_wait(REVISE, "webshop")
    assert is_revision_wait(REVISE, "sciworld") and not is_revision_wait(PLAIN_WAIT, "sciworld")
    assert not is_revision_wait(f"Thought: {REVISION_THOUGHTS[1]}\nAction: inventory", "textcraft")
    assert is_revision_turn(f"Thought: {REVISION_THOUGHTS[1]}\nAction: inventory", "sciworld")


@pytest.mark.parametrize("flags, env, want", [([], {}, "env"), (["--wait_reply", "ok"], {}, "ok"),
                                              ([], {"WAIT_REPLY": "ok"}, "ok"),
                                              (["--wait_reply", "env"], {"WAIT_REPLY": "ok"}, "env")])
def test_the_flag_and_env_var(flags, env, want):
    assert parse(ev.EvalSettings, flags, {"TASK": "textcraft", **env}).wait_reply == want


def test_an_unknown_reply_is_one_clear_line():
    with pytest.raises(UsageError, match=r"WAIT_REPLY='yes' is not one of env, ok"):
        parse(ev.EvalSettings, [], {"TASK": "textcraft", "WAIT_REPLY": "yes"})
