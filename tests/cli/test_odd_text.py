"""Odd text from the model or the env: replies without `Action:`, huge, empty,
or with odd unicode, and observations with odd unicode, are stepped, stored
whole and read back equal, in search and eval."""
from __future__ import annotations

import json

from agent_r.conversation import clean_observation, parse_action
from agent_r.io import atomic_write_json, read_json
from agent_r.tree import load_tree
from tests.support import tree_fixtures as tf
from tests.support.faults import TABLE, files, run_script

HUGE = "Thought: " + "very " * 4000 + "long.\nAction: get 1 oak logs"
ODD = "Thought: 😀 \u202eevil\u202c e\u0301 \u2028 \ud800 tab\there\nAction: inventory"
REPLIES = {
    "no action": "I think I should look at my inventory first\ninventory",
    "huge": HUGE,
    "empty": "",
    "odd unicode": ODD,
}


def test_odd_model_replies_in_eval_and_search(tmp_path, textcraft_server):
    """Replies without `Action:`, of 20k characters, empty, or with odd unicode
    (RTL override, combining marks, U+2028, a lone surrogate): the action is
    the parsed one (last non-empty line when no `Action:`), the env answers,
    the reply is stored whole, and the files read back equal."""
    table = tmp_path / "policy.json"
    table.write_text(json.dumps({"default": list(REPLIES.values())}))   # sample i gets reply i mod 4
    env = {"TASK": "textcraft", "MODEL_DIR": table, "MODEL_NAME": "t", "MAX_TOKEN_LENGTH": "300",
           "MAX_DEPTH": "2", "ITERA": "2", "N_GEN": "4"}
    res = run_script("mcts_collection.py", "--env_server_base", textcraft_server, "--backend", TABLE,
                     "--model_name", "t", "--min", "1", "--max", "2", "--output_dir", tmp_path / "s", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    root = load_tree(tmp_path / "s" / "textcraft" / "t" / "search_results_1.json")
    by_turn = {c.llm_response: c for c in root.children}
    assert by_turn[HUGE].action == "get 1 oak logs" and by_turn[HUGE].obs
    assert by_turn[REPLIES["no action"]].action == "inventory"
    assert by_turn[""].action == "" and by_turn[""].obs.startswith("Could not execute")
    assert by_turn[ODD.strip()].state[-2]["content"] == ODD.strip()   # lone surrogate and all, read back equal

    for reply in REPLIES.values():
        t = tmp_path / "one.json"
        t.write_text(json.dumps({"default": [reply]}))
        out = tmp_path / "e"
        res = run_script("eval.py", "--env_server_base", textcraft_server, "--backend", TABLE, "--limit", "1",
                         "--max_steps", "3", "--output_dir", out, "--model_name", repr(len(reply)),
                         env={**env, "MODEL_DIR": t})
        assert res.returncode == 0, res.stderr[-2000:]
        result = next(iter(json.loads(d) for d in files(out / "textcraft" / f"{len(reply)}_eval").values()))
        assert result["ended_by"] == "step_limit" and result["step_num"] == 3
        assert [m["content"] for m in result["state"][4::2]] == [reply.strip()] * 3


def test_odd_unicode_observations_round_trip(tmp_path, textcraft_server):
    """Observations are stored with \\r, \\n and \\t as spaces; everything else
    (emoji, RTL marks, U+2028, NUL, a lone surrogate) is kept and survives the
    atomic JSON write and the tree loader."""
    import requests

    odd = "craft 1 \u00e9p\u00e9e using 1 \U0001F5E1\ufe0f\nline\u2028sep\tcol\r\nNUL\x00 \ud800"
    assert clean_observation(odd) == odd.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    made = requests.post(f"{textcraft_server}/create", json={"commands": "craft 1 \u00e9p\u00e9e using 1 \U0001F5E1",
                                                              "goal": "\u00e9p\u00e9e"}).json()
    try:
        assert "\U0001F5E1" in made["observation"]   # the server sends odd unicode through unchanged
    finally:
        requests.post(f"{textcraft_server}/close", json={"id": made["id"]})
    root = tf.make_root(task=odd)
    tf.add_step(root, "inventory", clean_observation(odd), score=1)
    tf.backup(root)
    path = tmp_path / "search_results_0.json"
    atomic_write_json(path, root.to_dict())
    back = load_tree(path)
    assert back.state[3]["content"] == odd and back.children[0].obs == clean_observation(odd)
    assert read_json(path) == root.to_dict()
    assert parse_action("Action: get 1 \U0001F5E1\u2028") == "get 1 \U0001F5E1"
