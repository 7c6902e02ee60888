"""DPO pairs: the ETO layout (the whole continuations after the shared
prefix, both needed) and the TRL layout (one step: the first assistant turns
where the paths part, an identical step pair once; none where the same turn
met different observations or one path ends)."""
from __future__ import annotations

import pytest

from agent_r import export
from tests.support import tree_fixtures as tf
from tests.support.export_rows import HEAD, revision_rows


def test_dpo_layouts_split_at_the_shared_prefix():
    row = revision_rows(tf.tree_shared_prefix(), None)[0]
    turn = tf.turn_text
    trl = export.dpo_pairs([row], "trl")[0]
    assert set(trl) == {"prompt", "chosen", "rejected"}
    assert [m["role"] for m in trl["prompt"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert trl["prompt"][4] == {"role": "assistant", "content": turn("get 1 oak log")}
    # TRL: one step, the first turns where the paths part (no observation in a completion)
    assert trl["chosen"] == [{"role": "assistant", "content": turn("craft 4 oak planks using 1 oak log")}]
    assert trl["rejected"] == [{"role": "assistant", "content": turn("get 1 diamond")}]
    assert export.dpo_pairs([row, row], "trl") == [trl]                 # the same step pair once
    eto = export.dpo_pairs([row, row], "eto")
    assert [e["id"] for e in eto] == ["0_0", "0_1"]
    assert eto[0]["prompt"][0] == {"from": "human", "value": tf.INSTRUCTION}
    assert [t["from"] for t in eto[0]["prompt"]] == ["human", "gpt", "human", "gpt", "human"]
    assert eto[0]["chosen"][-1] == {"from": "gpt", "value": turn("craft 4 stick using 2 oak planks")}
    assert [t["from"] for t in eto[0]["rejected"]] == ["gpt", "human", "gpt"]


def test_eto_pair_needs_both_continuations():
    shared = HEAD + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "o"}]
    longer = shared + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "p"}]
    row = {"task_num": "7", "high_log": shared, "low_log": longer}
    assert export.eto_pair(row, 0) is None                       # the high path adds nothing
    assert export.eto_pair({**row, "high_log": longer, "low_log": shared}, 0) is None
    pair = export.eto_pair({**row, "low_log": shared[:4] + [{"role": "assistant", "content": "x"}]}, 3)
    assert pair["id"] == "7_3" and pair["chosen"][0]["value"] == "a" and pair["rejected"][0]["value"] == "x"


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
