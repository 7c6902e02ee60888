"""The tree viewer's pages without a browser (agent_r/view.py): the embedded
data (every node, its kind by the task's score scale), its escaping,
revision rows matched to their nodes (rows of other trees left out, foreign
paths counted), the folder index with a broken file listed, and one-line
errors for bad input. The pages in a real browser: tests/viewer/test_browser.py."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r import view
from agent_r.tree import load_tree
from tests.support import tree_fixtures as tf
from tests.support.env_fixtures import ROOT
from tests.support.viewer_fixtures import (FAILED_LEAVES, HOSTILE_ACTION, HOSTILE_OBS, IDS, SUCCESS_LEAVES,
                                           expected_pair, viewer_tree, write_viewer_run)


DATA = re.compile(r'<script type="application/json" id="tree-data">(.*?)</script>', re.S)


def embedded(page: Path) -> dict:
    """The page's data as the browser reads it: the text up to the first '</script>'."""
    return json.loads(DATA.search(page.read_text(encoding="utf-8")).group(1))


def run_view(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent_r.view", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_page_embeds_every_node_and_survives_a_script_end_in_an_observation(tmp_path):
    tree = tf.write_tree(viewer_tree(), tmp_path, 3)
    assert view.main([str(tree), "-o", str(tmp_path / "t.html")]) == 0
    page = (tmp_path / "t.html").read_text(encoding="utf-8")
    assert page.count("</script>") == 2                     # the template's own two, nothing from the data
    assert "<script>document.body" not in page and "__DATA__" not in page
    data = embedded(tmp_path / "t.html")
    nodes = data["nodes"]
    assert len(nodes) == sum(1 for _ in load_tree(tree).iter_nodes()) == 10
    assert (nodes[9]["action"], nodes[9]["obs"]) == (HOSTILE_ACTION, HOSTILE_OBS)   # round-trips exactly
    assert {i for i, n in enumerate(nodes) if n["kind"] == "success"} == SUCCESS_LEAVES
    assert {i for i, n in enumerate(nodes) if n["kind"] == "fail"} == FAILED_LEAVES
    assert nodes[IDS["get 1 oak log"]]["children"] == [2, 3, 4] and nodes[2]["parent"] == 1
    assert data["summary"] == {"nodes": 10, "leaves": 7, "successes": 2, "max_depth": 2, "pairs": 0}
    assert data["revisions"] is False and data["pairs"] == []
    assert [m["role"] for m in data["head"]] == ["system", "user", "assistant", "user"]
    assert nodes[2]["turn"] == tf.turn_text("craft 4 oak planks using 1 oak log")
    assert f"<title>{tmp_path.name}/search_results_3.json</title>" in page


def test_a_lone_surrogate_in_a_model_turn_still_makes_a_page(tmp_path):
    root = tf.make_root()
    tf.add_step(root, "get 1 \ud800", "junk \udfff", score=0)
    tree = tmp_path / "search_results_1.json"
    tree.write_text(json.dumps(tf.backup(root).to_dict()))              # ASCII JSON: the surrogates escaped
    assert view.main([str(tree), "-o", str(tmp_path / "t.html")]) == 0
    assert embedded(tmp_path / "t.html")["nodes"][1]["obs"] == "junk \udfff"


def test_revision_rows_are_matched_to_their_nodes(tmp_path):
    tree, jsonl = write_viewer_run(tmp_path)
    rows = [json.loads(line) for line in jsonl.read_text().split("\n") if line]   # not splitlines: U+2028
    out = tmp_path / "t.html"
    assert view.main([str(tree), "--revisions", str(jsonl), "-o", str(out)]) == 0
    data = embedded(out)
    assert data["revisions"] is True and data["unmatched"] == 0 and data["summary"]["pairs"] == len(rows) == 10
    for row, pair in zip(rows, data["pairs"]):
        assert {k: pair[k] for k in ("high", "low", "splice", "first_bad", "first_bad_step")} == expected_pair(row)
        assert pair["sample"] == [{"role": m["role"], "content": m["content"], "loss": m.get("loss")}
                                  for m in row["revise_log"]]
        revision = pair["sample"][pair["revision_at"]]      # the splice in the sample: the revision turn
        assert revision["role"] == "assistant" and revision["content"].endswith("Action: wait") and revision["loss"]
        assert all(m["loss"] is False for m in pair["sample"][:pair["revision_at"]] if m["role"] == "assistant")
    assert any(p["first_bad"] == IDS["get 1 diamond"] for p in data["pairs"])


def test_rows_of_other_trees_are_left_out_and_foreign_paths_counted(tmp_path, capsys):
    tree, jsonl = write_viewer_run(tmp_path, idx=7)
    rows = view.read_revisions([str(jsonl)])
    other = tf.write_tree(tf.tree_shared_prefix(), tmp_path / "other", 8)
    assert view.page_data(load_tree(other), other, rows)["pairs"] == []          # task_num 7 is not tree 8
    foreign = tf.write_tree(tf.tree_shared_prefix(), tmp_path / "foreign", 7)   # same index, other search
    data = view.page_data(load_tree(foreign), foreign, rows)
    assert data["pairs"] == [] and data["unmatched"] == len(rows)
    assert view.main([str(foreign), "--revisions", str(jsonl), "-o", str(tmp_path / "f.html")]) == 0
    assert "match none of its paths" in capsys.readouterr().err
    unnamed = tmp_path / "my_tree.json"                                        # no index: rows matched by path
    unnamed.write_bytes(tree.read_bytes())
    assert len(view.page_data(load_tree(unnamed), unnamed, rows)["pairs"]) == len(rows)


def test_direct_revision_rows_have_the_whole_low_path_as_bad_prefix(tmp_path):
    trees = tmp_path / "textcraft"
    tf.write_tree(viewer_tree(), trees, 1)
    from agent_r.revision_data import PathSettings, collect
    result = collect(PathSettings(task="textcraft", input_dir=str(trees), output_dir=str(tmp_path), revise=False))
    rows = view.read_revisions([str(result.output)])
    pairs = view.page_data(load_tree(trees / "search_results_1.json"), trees / "search_results_1.json", rows)["pairs"]
    assert pairs and all(p["first_bad"] is None and p["cut"] == p["low"][-1] for p in pairs)


def test_folder_gives_an_index_and_a_page_per_tree_and_lists_a_broken_file(tmp_path):
    run = tmp_path / "trees"
    tf.write_tree(viewer_tree(), run / "textcraft" / "m", 2)
    tf.write_tree(tf.tree_no_success(), run / "textcraft" / "m", 10)
    tf.write_tree(tf.tree_one_leaf(), run / "sub" / "textcraft" / "m", 2)
    (run / "textcraft" / "m" / "search_results_4.json").write_text("{corrupt")
    (run / "textcraft" / "m" / "manifest.json").write_text("{}")               # not a tree file: not listed
    out = tmp_path / "pages"
    res = run_view(run, "-o", out)
    assert res.returncode == 1, res.stderr                                     # a broken item: exit 1, listed
    assert "search_results_4.json" in res.stderr and "Traceback" not in res.stderr
    index = (out / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+)">', index)
    assert links == ["sub/textcraft/m/search_results_2.html", "textcraft/m/search_results_2.html",
                     "textcraft/m/search_results_10.html"]
    assert all((out / link).exists() for link in links)
    cells = {m[0]: m[1:] for m in re.findall(r'<a href="([^"]+)">[^<]*</a></td><td>(\d+)</td><td>(\d+)</td>'
                                             r'<td>(\d+)</td>', index)}
    assert cells["textcraft/m/search_results_2.html"] == ("10", "7", "2")      # nodes, leaves, successes
    assert cells["textcraft/m/search_results_10.html"] == ("3", "2", "0")
    assert 'class="failed"' in index and "corrupt JSON" in index
    page = embedded(out / "textcraft" / "m" / "search_results_2.html")
    assert page["index"] == "../../index.html"


def test_success_follows_the_tasks_score_scale(tmp_path):
    root = tf.tree_scored([100.0, 40.0, 0.0])
    plain = tf.write_tree(root, tmp_path, 1)                                   # no task in the path: 0-100 scale
    assert [n["kind"] for n in view.page_data(root, plain, None)["nodes"][1:]] == ["success", "fail", "fail"]
    textcraft = tf.write_tree(tf.tree_scored([1.0, 0.5]), tmp_path / "textcraft", 1)
    kinds = [n["kind"] for n in view.page_data(load_tree(textcraft), textcraft, None)["nodes"][1:]]
    assert kinds == ["success", "fail"]
    assert view.page_data(root, plain, None, task="sciworld")["max_score"] == 100.0


@pytest.mark.parametrize("case", ["missing tree", "corrupt tree", "not a tree", "missing revisions",
                                  "corrupt revisions", "empty folder"])
def test_bad_input_is_one_line_without_traceback(tmp_path, case):
    tree = tf.write_tree(viewer_tree(), tmp_path, 1)
    bad = tmp_path / "bad.json"
    args = {
        "missing tree": [tmp_path / "nope.json", "-o", tmp_path / "x.html"],
        "corrupt tree": [bad, "-o", tmp_path / "x.html"],
        "not a tree": [bad, "-o", tmp_path / "x.html"],
        "missing revisions": [tree, "--revisions", tmp_path / "none.jsonl", "-o", tmp_path / "x.html"],
        "corrupt revisions": [tree, "--revisions", bad, "-o", tmp_path / "x.html"],
        "empty folder": [tmp_path / "empty", "-o", tmp_path / "out"],
    }[case]
    bad.write_text('{"visits": 1}' if case == "not a tree" else "{corrupt")
    (tmp_path / "empty").mkdir()
    res = run_view(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr
    assert not (tmp_path / "x.html").exists()
