"""SPEC section 4 (training export) promises, in process against
agent_r.export's public functions: the per-message ``loss`` flag is always an
explicit boolean, also when a row spells it as a string; a good ratio of 0
adds no good samples; rows that are not path_collection rows are refused
naming file and line; an ETO pair needs both continuations; the training file
is one compact JSON document."""
from __future__ import annotations

import json

import pytest

from agent_r import export
from agent_r.settings import UsageError
from tests.support import tree_fixtures as tf

HEAD = [{"role": "system", "content": "s"}, {"role": "user", "content": "i"},
        {"role": "assistant", "content": "Ok.", "loss": False}, {"role": "user", "content": "task"}]


def test_string_loss_flags_become_booleans():
    msgs = HEAD + [{"role": "assistant", "content": "a", "loss": " True "},
                   {"role": "user", "content": "o"},
                   {"role": "assistant", "content": "b", "loss": "false"},
                   {"role": "assistant", "content": "c", "loss": "TRUE"},
                   {"role": "assistant", "content": "d"}]
    out = export.xtuner_messages(msgs)
    assert [m["loss"] for m in out if m["role"] == "assistant"] == [False, True, False, True, True]
    assert all("loss" not in m for m in out if m["role"] != "assistant")


def rows(n_rev: int, n_good: int) -> tuple[list[dict], list[dict]]:
    rev = [{"task_num": str(i), "revise_log": HEAD + [{"role": "assistant", "content": f"r{i}", "loss": True}],
            "high_log": HEAD, "low_log": HEAD} for i in range(n_rev)]
    good = [{"task_num": str(i), "revise_log": HEAD + [{"role": "assistant", "content": f"g{i}", "loss": True}]}
            for i in range(n_good)]
    return rev, good


@pytest.mark.parametrize("ratio,expected_good", [(0.0, 0), (0.5, 2), (1.0, 4), (-1.0, 6)])
def test_good_ratio(ratio, expected_good):
    rev, good = rows(4, 6)
    samples = export.xtuner_samples(rev, good, ratio, seed=0)
    contents = [s["messages"][-1]["content"] for s in samples]
    assert sum(c.startswith("g") for c in contents) == expected_good
    assert sum(c.startswith("r") for c in contents) == 4


@pytest.mark.parametrize("line,needle", [
    ('[1, 2]', "expected a path_collection row with a 'revise_log' list"),
    ('{"task_num": "1"}', "expected a path_collection row with a 'revise_log' list"),
    ('{"revise_log": "text"}', "expected a path_collection row with a 'revise_log' list"),
    ('{"revise_log": [], "high_log": "x", "low_log": []}', "'high_log' and 'low_log' must be message lists"),
    ('{"revise_log": [], "high_log": [], "low_log": null}', "'high_log' and 'low_log' must be message lists"),
    ('{"revise_log": [', "not valid JSON"),
])
def test_rows_that_are_not_path_collection_rows_name_file_and_line(tmp_path, line, needle):
    good_row = json.dumps({"task_num": "1", "revise_log": HEAD})
    path = tmp_path / "in.jsonl"
    path.write_text(f"{good_row}\n\n{line}\n", encoding="utf-8")
    with pytest.raises(UsageError) as err:
        export.read_rows([str(path)])
    assert f"{path}:3:" in str(err.value) and needle in str(err.value)


def test_rows_are_split_into_revision_and_good_rows(tmp_path):
    rev, good = rows(2, 3)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rev + good) + "\n",
                    encoding="utf-8")
    got_rev, got_good = export.read_rows([str(path)])
    assert got_rev == rev and got_good == good


def test_eto_pair_needs_both_continuations():
    shared = HEAD + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "o"}]
    longer = shared + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "p"}]
    row = {"task_num": "7", "high_log": shared, "low_log": longer}
    assert export.eto_pair(row, 0) is None                       # the high path adds nothing
    assert export.eto_pair({**row, "high_log": longer, "low_log": shared}, 0) is None
    pair = export.eto_pair({**row, "low_log": shared[:4] + [{"role": "assistant", "content": "x"}]}, 3)
    assert pair["id"] == "7_3" and pair["chosen"][0]["value"] == "a" and pair["rejected"][0]["value"] == "x"


def test_write_export_writes_one_compact_json_document(tmp_path):
    path = tmp_path / "textcraft_centric.jsonl"
    root = tf.tree_many_leaves()
    from agent_r import revision
    from agent_r.revision_data import PathSettings

    cfg = PathSettings(task="textcraft", revise=False).revision_config()
    (res,) = revision.process_trees([revision.plan_tree(1, root, cfg)], cfg, None)
    path.write_text("".join(json.dumps(r) + "\n" for r in res.rows))
    out = tmp_path / "train.json"
    line = export.write_export(export.ExportSettings(format="xtuner", input=[str(path)], output=str(out)))
    assert line.startswith(f"wrote {len(res.rows)} samples ({len(res.rows)} revision + 0 good) to {out}")
    text = out.read_text()
    assert text.count("\n") == 1 and len(json.loads(text)) == len(res.rows)
    dpo = tmp_path / "dpo.json"
    line = export.write_export(export.ExportSettings(format="dpo", input=[str(path)], output=str(dpo)))
    assert "preference pairs (eto layout)" in line and json.loads(dpo.read_text())


def step(role: str, content: str) -> dict:
    return {"role": role, "content": content}


@pytest.mark.parametrize("high_tail,low_tail,expected", [
    # the paths part at a turn: that turn is chosen / rejected, the shared step is prompt
    ([step("assistant", "a"), step("user", "o"), step("assistant", "b")],
     [step("assistant", "a"), step("user", "o"), step("assistant", "x")], ("b", "x", 6)),
    # the same turn met different observations: no step where the model chose differently
    ([step("assistant", "a"), step("user", "o1"), step("assistant", "b")],
     [step("assistant", "a"), step("user", "o2"), step("assistant", "x")], None),
    # one path ends where the other goes on: nothing to prefer
    ([step("assistant", "a"), step("user", "o")], [step("assistant", "a"), step("user", "o"),
                                                    step("assistant", "x")], None),
    # a malformed log (a user message where a turn belongs) is skipped, not paired
    ([step("user", "odd"), step("assistant", "b")], [step("assistant", "x"), step("user", "o")], None),
    ([step("assistant", "x"), step("user", "o")], [step("user", "odd"), step("assistant", "b")], None),
])
def test_trl_step_pair(high_tail, low_tail, expected):
    pair = export.trl_step_pair(HEAD + high_tail, HEAD + low_tail)
    if expected is None:
        assert pair is None
    else:
        chosen, rejected, cut = expected
        assert pair["chosen"] == [step("assistant", chosen)] and pair["rejected"] == [step("assistant", rejected)]
        assert pair["prompt"] == [{"role": m["role"], "content": m["content"]} for m in (HEAD + high_tail)[:cut]]


def test_xtuner_export_says_how_token_lengths_fared(tmp_path):
    rev, good = rows(1, 1)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rev + good))
    line = export.write_export(export.ExportSettings(format="xtuner", input=[str(path)], output=str(tmp_path / "o")))
    first, note = line.split("\n")
    assert first.startswith("wrote 2 samples") and "token lengths" in note
