"""Every documented search command selects the train tasks its text says:
--min/--max bound task ids, not positions, so `--min 0 --max 444` (once in
every cluster command) selected 355 of the 444 TextCraft train tasks. A
command without bounds must select all 444; one with bounds must say in its
comment how many it selects (`# the 160 train tasks ...`), and the count
is checked against the real local server's split."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_r.envs import get_env
from agent_r.search import SearchSettings
from agent_r.settings import parse

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "slurm").glob("*.sbatch")), "scripts/launch_shards.sh"]
COUNT = re.compile(r"#.*?(?:all |the )?(\d+) train tasks")


def search_commands() -> list[tuple[str, str]]:
    """(document, line) of every line that runs mcts_collection.py, continuation lines joined."""
    found = []
    for doc in DOCUMENTS:
        text = (ROOT / doc).read_text().replace("\\\n", " ")
        found += [(doc, line) for line in text.splitlines() if re.search(r"python mcts_collection\.py", line)]
    return found


def selected(line: str, server: str) -> int:
    command = re.split(r"\s#", line.split("mcts_collection.py", 1)[1])[0]
    # the bounds and the split decide the tasks
    flags = [w for pair in re.findall(r"(--min|--max|--split|--split_file)[ =](\S+)", command) for w in pair]
    settings = parse(SearchSettings, flags + ["--env_server_base", server], environ={"TASK": "textcraft"})
    settings.finish()
    return len(get_env("textcraft").search_indices(settings, server)[0])


def test_the_docs_show_search_commands():
    docs = {doc for doc, _ in search_commands()}
    assert {"README.md", "docs/cluster.md", "docs/search.md"} <= docs, docs


@pytest.mark.parametrize("doc,line", search_commands(), ids=lambda v: v if v.endswith((".md", ".sh", ".sbatch")) else "")
def test_a_documented_search_selects_the_tasks_its_text_says(doc, line, textcraft_server):
    count = selected(line, textcraft_server)
    said = COUNT.search(line)
    if "--min" in line or "--max" in line:
        assert said, f"{doc}: {line.strip()!r} bounds the tasks but does not say how many it selects ({count})"
    assert count == (int(said.group(1)) if said else 444), f"{doc}: {line.strip()!r} selects {count}"
