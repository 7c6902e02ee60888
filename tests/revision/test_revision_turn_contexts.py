"""bench_revision_turn's contexts: an eval folder gives its failed episodes
(cut after N model turns when asked); a revision-task file gives its rows as
they are, so every model of a run is measured on the same banked contexts."""
from __future__ import annotations

import json

from bench.bench_revision_turn import failed_episodes


def conversation(n: int) -> list[dict]:
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "rules"},
            {"role": "assistant", "content": "Ok."}, {"role": "user", "content": f"goal {n}"}]
    return head + [{"role": "assistant", "content": f"Action: get {n}"}, {"role": "user", "content": "Could not find"}] * 3


def test_a_revision_task_file_gives_its_rows_in_order(tmp_path):
    path = tmp_path / "revise_tasks_textcraft.jsonl"
    path.write_text("".join(json.dumps({"task_num": n, "messages": [{**m, "loss": False} for m in conversation(n)],
                                        "cut": 3}) + "\n" for n in (7, 3, 9)))
    got = failed_episodes(path, limit=2)
    assert got == [conversation(7), conversation(3)]


def test_an_eval_folder_gives_its_failed_episodes_cut(tmp_path):
    for n, success in ((2, False), (1, True), (10, False)):
        (tmp_path / f"search_results_{n}.json").write_text(json.dumps({"success": success, "state": conversation(n)}))
    got = failed_episodes(tmp_path, limit=5, cut=1)
    assert got == [conversation(2)[:6], conversation(10)[:6]]
