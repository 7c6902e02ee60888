"""scripts/rebuild_summaries.py: summaries rebuilt from banked episodes name
model_k's weights from model_k's adapter record and never guess a dtype or a
machine; a summary that has a provenance is left byte for byte; a results
row whose evals name two weights names none."""
from __future__ import annotations

import json
from pathlib import Path

from agent_r import conversation as conv
from agent_r.provenance import UNKNOWN
from agent_r.training.adapter import ADAPTER_RECORD, CHECKSUM
from scripts import rebuild_summaries as rebuild


def episodes(folder: Path, solved: set[int], tasks: int = 3) -> Path:
    folder.mkdir(parents=True)
    for task in range(tasks):
        state = conv.append_turn(conv.initial_conversation("instr", "Goal: craft stick."),
                                 "Thought: go.\nAction: get 1 stick", "Got 1 stick")
        (folder / f"search_results_{task}.json").write_text(json.dumps(
            {"task_id": task, "env_score": float(task in solved), "model_name": "m", "step_num": 1, "state": state,
             "success": task in solved, "ended_by": "done" if task in solved else "step_limit"}))
    return folder


def adapter_record(run: Path, k: int, variant: str, sha: str) -> None:
    folder = run / f"iter_{k}" / "model" / variant / "adapter"
    folder.mkdir(parents=True)
    (folder / ADAPTER_RECORD).write_text(json.dumps({CHECKSUM: sha}))


def test_a_rebuilt_summary_names_model_ks_weights_and_guesses_no_dtype(tmp_path):
    run, committed = tmp_path / "runs" / "r", tmp_path / "reproduction" / "r"
    for k, sha in ((1, "1" * 64), (2, "2" * 64)):
        adapter_record(run, k, "direct", sha)
    plain = episodes(run / "iter_2" / "eval_amx" / "direct" / "textcraft" / "direct-iter2_test", {0})
    fp32 = episodes(run / "iter_2" / "eval_fp32" / "direct" / "textcraft" / "direct-iter2_test", {0, 1})
    got = rebuild.rebuild(plain, run, committed)
    assert got["model_sha256"] == "2" * 64 and got["provenance"]["model_sha256"] == "2" * 64   # model_2, not model_1
    assert got["provenance"]["dtype"] == UNKNOWN and got["provenance"]["machines"] == [UNKNOWN]
    assert got["tasks"] == 3 and got["success_rate"] == 1 / 3
    assert rebuild.rebuild(fp32, run, committed)["provenance"]["dtype"] == "float32"   # the folder's EVAL_TAG says it


def test_only_the_runs_own_evals_take_a_machine_from_the_calls(tmp_path):
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps({"stage": "merge, fine-tunes and evals of iteration 3", "variants": ["agent-r"],
                                 "machine": "AMD EPYC"}) + "\n")
    own = Path("iter_3/eval/agent-r/textcraft/agent-r-iter3_test")
    assert rebuild.call_machines(calls, own) == ["AMD EPYC"]
    # an eval run by hand later (a tag, another reply) ran on a machine the calls do not name
    assert rebuild.call_machines(calls, Path("iter_3/eval_amx/agent-r/textcraft/agent-r-iter3_test")) == []
    assert rebuild.call_machines(calls, Path("iter_3/eval_wait_ok/agent-r/textcraft/agent-r-iter3_test_wait_ok")) == []


def test_a_summary_with_a_provenance_is_left_byte_for_byte(tmp_path):
    path = tmp_path / "summary.json"
    text = json.dumps({"provenance": {"machines": ["box"]}, "model_sha256": "a" * 64}, indent=3)
    path.write_text(text)
    assert rebuild.backfill(path, None, ["other box"]) is False
    assert path.read_text() == text


def test_a_results_row_whose_evals_name_two_weights_names_none(tmp_path):
    committed = tmp_path / "reproduction" / "r"
    for part, name, sha in (("test", "agent-r-iter1_test", "a" * 64), ("revise", "agent-r-iter1_test_revise", "b" * 64)):
        folder = committed / "iter_1" / "eval" / "agent-r" / "textcraft" / name
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"provenance": {"model_sha256": sha}}))
    results = committed / "results.json"
    results.write_text(json.dumps({"rows": [{"iteration": 1, "variant": "agent-r", "test": {"textcraft": {}},
                                             "revise_task": {"textcraft": {}}}]}))
    assert rebuild.backfill_results(results, committed) == 2
    [row] = json.loads(results.read_text())["rows"]
    assert row["model_sha256"] == UNKNOWN
    assert row["test"]["textcraft"]["provenance"]["model_sha256"] == "a" * 64
