"""The per-tree part cache of path_collection.py: a rerun reuses every part
made from the same tree and the settings that decide its rows, with no model
call; a setting that cannot change a row (the tree batch) keeps every part,
and one that can (ALPHA, BETA, revise, the pair cap) redoes the trees."""
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
