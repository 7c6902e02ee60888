"""Reading path_collection rows for export: revision rows and good rows are
told apart, and a line that is not a path_collection row is refused naming
the file and line."""
from __future__ import annotations

import json

import pytest

from agent_r import export
from agent_r.settings import UsageError
from tests.support.export_rows import HEAD, rows


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
    assert got_rev == [{**r, "env": None} for r in rev] and got_good == [{**r, "env": None} for r in good]
    (tmp_path / "textcraft_good.jsonl").write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert {r["env"] for r in sum(export.read_rows([str(tmp_path / "textcraft_good.jsonl")]), [])} == {"textcraft"}
