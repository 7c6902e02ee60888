"""The rules of provenance, each held on its own: what a summary records when
an eval resumes in a checkout without git, how a machine is named from the
CPU's flags, what a summary written before provenance yields, when a loop
row names its weights, and each condition ``eval.py --compare`` warns of.
The end-to-end runs (a real eval writing and resuming) are in
tests/evaluation/test_provenance.py."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_r import manifest, provenance
from agent_r.loop.runner import Loop
from agent_r.provenance import UNKNOWN

SETTINGS = {"temperature": 0.0, "samples": 1, "max_steps": 30, "wait_reply": "env", "max_new_tokens": 100,
            "max_token_length": 2048}


def eval_settings(**changed) -> SimpleNamespace:
    s = {**SETTINGS, **changed}
    return SimpleNamespace(temperature=s["temperature"], eval_samples=s["samples"], max_steps=s["max_steps"],
                           wait_reply=s["wait_reply"], max_new_tokens=s["max_new_tokens"],
                           max_token_length=s["max_token_length"])


def test_an_eval_resumed_without_git_keeps_the_earlier_commit_beside_its_own_unknown(monkeypatch):
    monkeypatch.setattr(provenance, "git_commit", lambda: None)         # a checkout without .git
    monkeypatch.setattr(provenance, "machine", lambda: "this box")
    got = provenance.of_summary(eval_settings(), {}, {"machines": ["that box"], "commits": ["abc123"]}, played=True)
    assert got["commits"] == ["abc123", UNKNOWN] and got["machines"] == ["that box", "this box"]
    # nothing played here: nothing of this checkout is added
    idle = provenance.of_summary(eval_settings(), {}, {"machines": ["that box"], "commits": ["abc123"]}, played=False)
    assert idle["commits"] == ["abc123"] and idle["machines"] == ["that box"]


def test_a_sampled_eval_records_its_samples_and_temperature():
    got = provenance.of_summary(eval_settings(samples=4, temperature=1.0), {}, {}, played=False)
    assert got["settings"]["samples"] == 4 and got["settings"]["temperature"] == 1.0


@pytest.mark.parametrize("flags, named", [
    ("fpu sse avx512f amx_bf16 amx_tile avx512_bf16", "Some CPU, 2 CPU cores, AMX, AVX512-BF16"),
    ("fpu sse avx512f avx512_bf16", "Some CPU, 2 CPU cores, AVX512-BF16"),
    ("fpu sse avx2", "Some CPU, 2 CPU cores"),
])
def test_a_machine_is_named_with_the_bf16_instructions_its_cpu_flags_hold(monkeypatch, tmp_path, flags, named):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n")
    real_path = manifest.Path
    monkeypatch.setattr(manifest, "Path", lambda p: cpuinfo if str(p) == "/proc/cpuinfo" else real_path(p))
    monkeypatch.setattr(manifest.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(OSError("no nvidia-smi")))
    monkeypatch.setattr(manifest.os, "cpu_count", lambda: 2)
    manifest.machine.cache_clear()   # named once a process; this test names three
    try:
        assert manifest.machine() == named
    finally:
        manifest.machine.cache_clear()


def test_a_summary_from_before_provenance_yields_its_backend_dtype_and_settings(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "model_sha256": "f" * 64, "backend": {"backend": "vllm", "dtype": "bfloat16"},
        "config": {"model_name": "agent-r-iter1", "temperature": 1.0, "eval_samples": 4, "max_steps": 30,
                   "wait_reply": "env", "max_new_tokens": 100, "max_token_length": 2048}}))
    got = provenance.recorded(tmp_path)
    assert (got["backend"], got["dtype"], got["model_sha256"]) == ("vllm", "bfloat16", "f" * 64)
    assert got["machines"] == [UNKNOWN] and got["commits"] == [UNKNOWN]          # nothing recorded them
    assert got["settings"] == {**SETTINGS, "temperature": 1.0, "samples": 4}


def test_a_loop_row_names_its_weights_only_where_its_evals_agree():
    def row(test_sha: str, revise_sha: str) -> dict:
        return {"iteration": 1, "variant": "agent-r",
                "test": {"textcraft": {"provenance": {"model_sha256": test_sha}}},
                "revise_task": {"textcraft": {"provenance": {"model_sha256": revise_sha}}}}

    two = row("a" * 64, "b" * 64)
    Loop.fill_provenance(SimpleNamespace(), two)
    assert "model_sha256" not in two                                   # two weights: none named
    one = row("a" * 64, UNKNOWN)
    Loop.fill_provenance(SimpleNamespace(), one)
    assert one["model_sha256"] == "a" * 64


def run_folder(root: Path, name: str, model_name: str = "m", **fields) -> str:
    record = {"model_sha256": "a" * 64, "backend": "vllm", "dtype": "bfloat16", "machines": ["box"],
              "commits": ["c1"], "settings": dict(SETTINGS)}
    settings = fields.pop("settings", {})
    record.update(fields)
    record["settings"].update(settings)
    folder = root / name
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"provenance": record, "config": {"model_name": model_name}}))
    return str(folder)


def warning_of(tmp_path: Path, second: dict, model_name: str = "m", same_model_weights: bool = True) -> list[str]:
    runs = [run_folder(tmp_path, "first"), run_folder(tmp_path, "second", model_name, **second)]
    return provenance.warnings(runs, ["first", "second"], same_model_weights=same_model_weights)


def test_compare_is_silent_when_nothing_differs(tmp_path):
    assert warning_of(tmp_path, {}) == []


@pytest.mark.parametrize("second, says", [
    ({"backend": "hf"}, "backend vllm vs hf"),
    ({"dtype": "float32"}, "dtype bfloat16 vs float32"),
    ({"machines": ["other box"]}, "machines ['box'] vs ['other box']"),
    ({"settings": {"temperature": 1.0}}, "settings temperature 0.0 vs 1.0"),
    ({"settings": {"samples": 4}}, "settings samples 1 vs 4"),
    ({"settings": {"max_steps": 20}}, "settings max_steps 30 vs 20"),
    ({"settings": {"wait_reply": "ok"}}, "settings wait_reply env vs ok"),
    ({"model_sha256": "b" * 64}, "model_sha256 aaaaaaaaaaaa vs bbbbbbbbbbbb for the same model name"),
])
def test_compare_warns_in_one_line_of_each_condition_that_differs(tmp_path, second, says):
    [line] = warning_of(tmp_path, second)
    assert line.startswith("warning: second against first: ") and says in line


def test_compare_warns_when_both_machines_are_unknown(tmp_path):
    runs = [run_folder(tmp_path, "first", machines=[UNKNOWN]), run_folder(tmp_path, "second", machines=[UNKNOWN])]
    [line] = provenance.warnings(runs, ["first", "second"])
    assert "machines unknown" in line


def test_other_weights_warn_only_under_one_model_name(tmp_path):
    assert warning_of(tmp_path, {"model_sha256": "b" * 64}, model_name="another") == []


def test_two_recipes_models_of_one_name_need_not_warn_of_their_weights(tmp_path):
    assert warning_of(tmp_path, {"model_sha256": "b" * 64}, same_model_weights=False) == []


def test_a_manifest_names_no_path_of_the_machine_and_keeps_its_urls(tmp_path, monkeypatch):
    """Banked with the episodes and committed: the command and the settings
    name files inside the checkout relative to it, and a URL on the command
    line stays a URL (the line once went through the path rule whole)."""
    from agent_r import paths

    repo = tmp_path / "checkout"
    out = repo / "runs" / "r" / "iter_1" / "eval"
    out.mkdir(parents=True)
    monkeypatch.setattr(paths, "REPOSITORY", repo)
    monkeypatch.setattr(manifest.sys, "argv", [str(repo / "eval.py"), "--env_server_base", "http://127.0.0.1:36001",
                                               "--output_dir", str(out), "--limit", "3"])
    written = manifest.write_manifest(out / "manifest.json", {"output_dir": str(out), "model_dir": str(repo / "models" / "m")},
                                      None, {}, 0.0, None)
    assert written["command"] == "eval.py --env_server_base http://127.0.0.1:36001 --output_dir runs/r/iter_1/eval --limit 3"
    assert written["config"] == {"output_dir": "runs/r/iter_1/eval", "model_dir": "models/m"}
    assert str(tmp_path) not in (out / "manifest.json").read_text()
