"""Many trees at once: the pending expansions of every live tree share one
model call, and the trees are the same (byte for byte on disk) at any
concurrency; a tree whose env fails is reported while the others finish,
and a model failure stops the run with every env client closed."""
from __future__ import annotations

import json

import pytest

from tests.support.doubles import ScriptedBackend
from tests.support.search_doubles import SeededTextCraftDouble
from tests.support.search_runs import DOUBLE, SEARCH_ENV, collect, run, tree_files


def test_trees_do_not_depend_on_concurrency_and_expansions_are_batched(textcraft_server):
    indices = [1, 2, 3, 4, 6, 7, 8, 9]
    cfg = dict(max_depth=3, iterations=3, n_gen=3, seed=7)
    serial_backend, batched_backend = SeededTextCraftDouble(), SeededTextCraftDouble()
    serial, d1, _ = run(indices, textcraft_server, serial_backend, concurrency=1, **cfg)
    batched, d8, made = run(indices, textcraft_server, batched_backend, concurrency=8, **cfg)
    for i in indices:
        assert json.dumps(serial[i].result.to_dict()) == json.dumps(batched[i].result.to_dict())
    assert max(d1.batch_sizes) == 1 and max(d8.batch_sizes) == 8
    assert d1.requests == d8.requests == sum(r.job.stats.expansions for r in serial.values())
    assert d8.model_calls < d1.model_calls / 3
    assert batched_backend.stats.calls == d8.model_calls
    assert all(all(req.n == 3 for req in b.requests) for b in batched_backend.batches)
    assert len(made) == len(indices) and all(c._closed for c in made)
    assert sum(r.job.stats.successful_leaves for r in serial.values()) > 0  # the double does solve some


def test_failed_tree_is_reported_and_others_finish(textcraft_server):
    results, driver, made = run([1, -1, 3], textcraft_server, SeededTextCraftDouble(), concurrency=3,
                                max_depth=1, iterations=1, n_gen=2)
    assert results[-1].result is None and "data_idx" in str(results[-1].error)
    assert results[1].error is None and results[3].error is None
    assert all(c._closed for c in made)


def test_backend_failure_closes_every_client(textcraft_server):
    def policy(messages, i, seed):
        raise RuntimeError("model crashed")

    made = []
    with pytest.raises(RuntimeError, match="model crashed"):
        run([1, 2, 3], textcraft_server, ScriptedBackend(policy), concurrency=3, made=made,
            max_depth=1, iterations=1, n_gen=1)
    assert len(made) == 3 and all(c._closed for c in made)


def test_concurrency_gives_byte_identical_trees(tmp_path, textcraft_server):
    flags = ["--backend", DOUBLE, "--model_name", "m", "--min", "0", "--max", "14", "--seed", "5"]
    one = collect(tmp_path / "c1", textcraft_server, *flags, "--concurrency", "1", env=SEARCH_ENV)
    eight = collect(tmp_path / "c8", textcraft_server, *flags, "--concurrency", "8", env=SEARCH_ENV)
    assert one.returncode == 0 and eight.returncode == 0, one.stderr + eight.stderr
    a, b = tree_files(tmp_path / "c1" / "textcraft" / "m"), tree_files(tmp_path / "c8" / "textcraft" / "m")
    assert len(a) == 11 and a == b  # indices 0, 5, 10 are test tasks: never searched
    m1 = json.loads((tmp_path / "c1" / "textcraft" / "m" / "manifest.json").read_text())
    m8 = json.loads((tmp_path / "c8" / "textcraft" / "m" / "manifest.json").read_text())
    assert m1["stats"]["backend"]["calls"] > 3 * m8["stats"]["backend"]["calls"]
    assert m8["stats"]["mean_batch"] > 3
