"""Tree files path_collection.py meets that are not plain: extra keys are
ignored, a file that is not a tree is named and skipped (exit 1), and the
other trees still give their rows. Missing keys and corrupt JSON:
tests/revision/test_collection_run.py."""
from __future__ import annotations

import json

import pytest

from tests.support import tree_fixtures as tf
from tests.support.faults import run_script


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
    """A list, a node with wrong keys, an empty file: named on stderr without a
    traceback, exit 1, the good tree's rows written."""
    d = tmp_path / "trees"
    tf.write_tree(tf.tree_many_leaves(), d, 1)
    (d / "search_results_2.json").write_text(content)
    res = run_script("path_collection.py", "--input_dir", d, "--output_dir", tmp_path / "o", "--revise", "0",
                     env={"TASK": "textcraft"})
    assert res.returncode == 1 and "search_results_2.json" in res.stderr and needle in res.stderr
    assert "Traceback" not in res.stderr
    rows = (tmp_path / "o" / "textcraft_centric.jsonl").read_text().splitlines()
    assert rows and {json.loads(r)["task_num"] for r in rows} == {"1"}
