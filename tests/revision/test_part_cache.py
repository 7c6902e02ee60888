"""The per-tree part cache of path_collection.py: a rerun reuses every part
made from the same tree and the settings that decide its rows, with no model
call; a setting that cannot change a row (the tree batch) keeps every part,
and one that can (ALPHA, BETA, revise, the pair cap) redoes the trees. The
verifier model is made only when some tree needs judging."""
import dataclasses
import json
import shutil

import pytest

from agent_r import paths
from agent_r.knobs import BackendSettings
from agent_r.revision_data import PathSettings, collect
from tests.support import tree_fixtures as tf
from tests.support.doubles import ScriptedBackend
from tests.support.revision_cases import rows_of


def scripted_verifier():
    return ScriptedBackend(tf.verifier_policy({"get 1 diamond": "Bad"}))


def test_collect_resumes_from_the_part_cache_without_model_calls(trees, tmp_path):
    out = tmp_path / "data"
    first_backend = scripted_verifier()
    first = collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(out)), first_backend)
    assert first.exit_code == 0 and first.problem is None
    assert first_backend.stats.calls == 1 and first.verifier_prompts_this_run == first_backend.stats.requests > 0
    data = first.output.read_bytes()
    assert first.output == out / "textcraft_centric.jsonl" and first.rows == len(rows_of(first.output)) > 0

    # a setting that cannot change a row (the batch size) keeps every part valid
    again_backend = scripted_verifier()
    again = collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(out), tree_batch=1),
                    again_backend)
    assert again_backend.stats.calls == 0 and again.verifier_prompts_this_run == 0
    assert again.output.read_bytes() == data
    assert "(0 this run)" in again.report() and "model calls" not in again.report()
    same = lambda r: [x for i, x in enumerate(r.report().splitlines()) if i in (0, 1, 3)]  # noqa: E731
    assert same(again) == same(first)                           # totals come from the parts

    # a setting that decides rows redoes the trees
    third_backend = scripted_verifier()
    collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(out), max_pairs_per_tree=1),
            third_backend)
    assert third_backend.stats.calls == 1


def settings(trees, out, **overrides) -> PathSettings:
    return PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(out), **overrides)


def parts(out) -> list:
    """The part files of the centric TextCraft data under ``out``."""
    return sorted(paths.parts_dir(PathSettings(task="textcraft", output_dir=str(out))).iterdir())


def tag_parts(out) -> int:
    """Mark every part file; a part the next run rewrites loses the mark
    (the cache reads only a part's fingerprint and result)."""
    for part in parts(out):
        part.write_text(json.dumps({**json.loads(part.read_text()), "tagged": True}))
    return len(parts(out))


def tagged(out) -> list[bool]:
    return [json.loads(p.read_text()).get("tagged", False) for p in parts(out)]


@pytest.mark.parametrize("change,model_calls", [
    ({"alpha": 0.2}, 1), ({"beta": 0.2}, 1), ({"max_pairs_per_tree": 1}, 1), ({"revise": False}, 0),
])
def test_a_setting_that_decides_rows_redoes_every_tree(trees, tmp_path, change, model_calls):
    """ALPHA, BETA, the pair cap and revise each decide a tree's rows: after
    any of them changes, every part is made again (the verifier is asked
    again where it is used), none is reused."""
    out = tmp_path / "data"
    collect(settings(trees, out), scripted_verifier())
    assert tag_parts(out) == 5                                   # one part per tree, the skipped one too
    backend = scripted_verifier()
    result = collect(settings(trees, out, **change), backend)
    assert tagged(out) == [False] * 5
    assert backend.stats.calls == model_calls and (result.verifier_prompts_this_run > 0) == bool(model_calls)


def test_a_setting_that_cannot_change_a_row_keeps_every_part(trees, tmp_path):
    """The tree batch, the verifier's connection settings and where the same
    trees are read from decide no row: every part is reused, no model call."""
    out = tmp_path / "data"
    first = collect(settings(trees, out), scripted_verifier())
    tag_parts(out)
    moved = tmp_path / "elsewhere"
    shutil.copytree(trees, moved)
    backend = scripted_verifier()
    again = collect(settings(moved, out, tree_batch=1,
                             backend=dataclasses.replace(BackendSettings(), openai_timeout=5.0)), backend)
    assert tagged(out) == [True] * 5
    assert backend.stats.calls == 0 and again.verifier_prompts_this_run == 0
    assert again.output.read_bytes() == first.output.read_bytes()


def test_the_verifier_loads_only_when_a_tree_needs_judging(trees, tmp_path):
    """path_collection.py whose verifier cannot load on the rerun (its policy
    table is deleted after the first run, the settings unchanged): a rerun
    whose parts are all valid never makes it and exits 0; a changed tree
    needs judging, and the verifier's error is the run's one line."""
    from tests.support.faults import run_script

    table = tmp_path / "verifier.json"
    table.write_text(json.dumps({"default": ["Fine.\nJudgment: Good"]}))
    args = ["--input_dir", trees, "--output_dir", tmp_path / "data", "--backend", "python:tests.support.doubles:table_backend"]
    env = {"TASK": "textcraft", "MODEL_DIR": table}
    assert run_script("path_collection.py", *args, env=env).returncode == 0
    table.unlink()
    again = run_script("path_collection.py", *args, env=env)
    assert again.returncode == 0 and "(0 this run)" in again.stdout
    tf.write_tree(tf.tree_split_at_root(task=tf.TASK + " Changed."), trees, 3)
    changed = run_script("path_collection.py", *args, env=env)
    assert changed.returncode == 2 and changed.stderr.strip().splitlines()[-1].startswith("error: policy table")
