"""Bad files and values: each gets one clear line (exit 2) or a defined
behaviour. Cases other test files already cover are listed in
docs/long-jobs.md; these are the rest."""
from __future__ import annotations

import json

import pytest

from agent_r.conversation import clean_observation, parse_action
from agent_r.io import atomic_write_json, read_json
from agent_r.tree import load_tree
from tests.support import tree_fixtures as tf
from tests.support.faults import SEARCH_DOUBLE, TABLE, files, run_script

NOWHERE = "http://127.0.0.1:9"   # never contacted: values are checked first


def one_line_error(res, needle: str) -> None:
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert needle in res.stderr


@pytest.mark.parametrize("env,needle", [
    ({"N_GEN": "0"}, "N_GEN=0 is too small"),
    ({"N_GEN": "-3"}, "N_GEN=-3 is too small"),
    ({"ITERA": "-1"}, "ITERA=-1 is too small"),
    ({"ITERA": "2.5"}, "ITERA='2.5' is not an integer"),
    ({"MAX_DEPTH": "-1"}, "MAX_DEPTH=-1 is too small"),
    ({"MAX_TOKEN_LENGTH": "10"}, "MAX_TOKEN_LENGTH=10 is too small"),
    ({"TEMP": "-0.5"}, "TEMP=-0.5 is too small"),
    ({"TEMP": "nan"}, "TEMP='nan' is not a number"),
])
def test_search_values(tmp_path, env, needle):
    res = run_script("mcts_collection.py", "--env_server_base", NOWHERE, "--backend", SEARCH_DOUBLE,
                     "--model_name", "m", "--output_dir", tmp_path / "out", env={"TASK": "textcraft", **env})
    one_line_error(res, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content,needle", [
    ('{"item_id": "textcraft_1"}', "must be a JSON list"),
    ('[{"item_id": "textcraft_1"}', "is not valid JSON"),
    ('[{"item_id": "textcraft_one"}]', "does not end in _<index>"),
    ('["textcraft_1"]', "entry 0: expected {\"item_id\""),
    ('[{"id": 3}]', "entry 0: expected {\"item_id\""),
])
@pytest.mark.parametrize("script", ["mcts_collection.py", "eval.py"])
def test_split_file_in_the_wrong_format(tmp_path, script, content, needle):
    split = tmp_path / "split.json"
    split.write_text(content)
    res = run_script(script, "--env_server_base", NOWHERE, "--backend", SEARCH_DOUBLE, "--split_file", split,
                     "--output_dir", tmp_path / "out", env={"TASK": "textcraft", "MODEL_NAME": "m"})
    one_line_error(res, f"split file {split}")
    assert needle in res.stderr
    assert not (tmp_path / "out").exists()


def test_tree_with_unknown_keys_is_read_like_the_plain_tree(tmp_path):
    """Extra keys (a tool added a field) are ignored on read: the same rows as
    the plain tree. Missing keys and corrupt JSON: tests/revision/test_collection_run.py."""
    plain, extra = tmp_path / "plain", tmp_path / "extra"
    path = tf.write_tree(tf.tree_many_leaves(), plain, 4)
    data = json.loads(path.read_text())
    data["annotator_note"] = "checked"
    data["children"][0]["score_v2"] = 0.7
    extra.mkdir()
    (extra / path.name).write_text(json.dumps(data))
    outs = []
    for d in (plain, extra):
        res = run_script("path_collection.py", "--input_dir", d, "--output_dir", tmp_path / f"o_{d.name}",
                         "--revise", "0", env={"TASK": "textcraft"})
        assert res.returncode == 0, res.stderr
        outs.append((tmp_path / f"o_{d.name}" / "textcraft_centric.jsonl").read_bytes())
    assert outs[0] == outs[1] and outs[0]


@pytest.mark.parametrize("content,needle", [
    ("[]", "expected a node object, got list"),
    ('{"visits": "many"}', "node is missing keys"),
    ("", "corrupt JSON"),
])
def test_odd_tree_files_are_named_and_skipped(tmp_path, content, needle):
    d = tmp_path / "trees"
    tf.write_tree(tf.tree_many_leaves(), d, 1)
    (d / "search_results_2.json").write_text(content)
    res = run_script("path_collection.py", "--input_dir", d, "--output_dir", tmp_path / "o", "--revise", "0",
                     env={"TASK": "textcraft"})
    assert res.returncode == 1 and "search_results_2.json" in res.stderr and needle in res.stderr
    assert "Traceback" not in res.stderr
    rows = (tmp_path / "o" / "textcraft_centric.jsonl").read_text().splitlines()
    assert rows and {json.loads(r)["task_num"] for r in rows} == {"1"}


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
    the spec's parse (last non-empty line when no `Action:`), the env answers,
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
