"""See the search: an interactive HTML page per search tree (docs/viewer.md).

    python -m agent_r.view mcts_result/textcraft/MODEL/search_results_3.json \\
        --revisions mcts_training_data/textcraft_centric.jsonl -o tree.html
    python -m agent_r.view mcts_result/textcraft/MODEL -o viewer/     # index.html + a page per tree

Why one self-contained file: it opens from a cluster's scratch folder, a CI
artifact or a mail attachment, offline, with no server. The tree travels as
JSON inside the page; the page's own script (agent_r/view.html) builds rows
only for expanded nodes, so a tree of thousands of nodes with long
observations opens at once.

Why revision rows are matched here, not in the page: a row of
path_collection.py stores conversations, not node ids. Each path is found
again by the identity revision.py made it from (every step's turn and
observation, see ``revision.node_turn``), and the first bad step and splice
point are recomputed by the same rules (``verifier.make_verdict``,
``revision.divergence_index``), so the page shows what the data means.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from agent_r import paths
from agent_r.conversation import HEAD_LEN
from agent_r.envs import get_env
from agent_r.export import read_rows
from agent_r.io import atomic_write_text
from agent_r.revision import divergence_index, node_turn
from agent_r.verifier import BAD
from agent_r.settings import EXIT_ITEMS_FAILED, EXIT_OK, UsageError, run_cli
from agent_r.tree import Node, TreeFormatError, leaf_paths, load_tree

TEMPLATE = Path(__file__).with_name("view.html")
TASKS = ("textcraft", "sciworld", "webshop")


# --------------------------------------------------------------------------- what a page shows

def max_score(root: Node, path: Path, task: str | None) -> float:
    """The score of a solved task, which makes a leaf a success: the given
    task's, else the one a folder of the path names (mcts_result/textcraft/..),
    else guessed from the scores' scale (SciWorld scores 0-100, the others 0-1)."""
    task = task or paths.task_of(path)
    if task:
        return get_env(task).max_score
    return 100.0 if any(n.env_score > 1 for n in root.iter_nodes()) else 1.0


def node_kind(node: Node, solved: float) -> str:
    if node.parent is None:
        return "root"
    if node.children:
        return "inner"
    if not node.is_terminal:
        return "frontier"          # expanded but never played to an end
    return "success" if node.env_score >= solved else "fail"


def turn_of(node: Node) -> str:
    """The model turn as the conversation holds it (``llm_response`` when the
    state is not a conversation, e.g. a hand-made tree)."""
    state = node.state
    if len(state) >= HEAD_LEN + 2 and isinstance(state[-2], dict) and state[-2].get("role") == "assistant":
        return str(state[-2].get("content", ""))
    return "" if node.parent is None else node.llm_response


def node_table(root: Node, solved: float) -> tuple[list[dict], dict[int, int]]:
    """Nodes in pre-order (the root is 0) and a map id(node) -> index."""
    nodes: list[dict] = []
    index: dict[int, int] = {}
    for node in root.iter_nodes():
        index[id(node)] = len(nodes)
        nodes.append({
            "parent": -1 if node.parent is None else index[id(node.parent)], "children": [],
            "depth": node.depth, "action": node.action, "obs": node.obs, "turn": turn_of(node),
            "visits": node.visits, "value": node.value, "score": node.env_score,
            "terminal": node.is_terminal, "disaster": node.disaster, "kind": node_kind(node, solved),
        })
        if node.parent is not None:
            nodes[index[id(node.parent)]]["children"].append(len(nodes) - 1)
    return nodes, index


def log_turns(messages: list[dict]) -> tuple[tuple[str, str], ...]:
    """The (turn, observation) steps of a stored conversation after its head."""
    body = messages[HEAD_LEN:]
    return tuple((str(a["content"]), str(o["content"])) for a, o in zip(body[0::2], body[1::2]))


class PathIndex:
    """Leaf paths of one tree by their steps, to find a revision row's paths."""

    def __init__(self, root: Node, index: dict[int, int]) -> None:
        head = root.state[HEAD_LEN - 1] if len(root.state) >= HEAD_LEN else None
        self.task = str(head.get("content")) if isinstance(head, dict) else None   # the task's first observation
        self.paths: dict[tuple, list[int]] = {}
        try:
            for path in leaf_paths(root):
                self.paths.setdefault(tuple(node_turn(n) for n in path), [index[id(n)] for n in path])
        except TreeFormatError:     # states that are not conversations: no row can match
            self.paths = {}

    def find(self, messages: list[dict]) -> list[int] | None:
        if str(messages[HEAD_LEN - 1]["content"]) != self.task:
            return None
        return self.paths.get(log_turns(messages))


def pair_view(row: dict, paths: PathIndex) -> dict | None:
    """Node ids and markers of one revision row, or None when its paths are
    not in this tree. The bad prefix is what revision.revision_row kept: the
    judged steps (up to and including the first Bad), or the whole low path
    for direct revision (no judgements)."""
    try:
        high, low = paths.find(row["high_log"]), paths.find(row["low_log"])
        if high is None or low is None:
            return None
        feedback = row.get("revise_feedback")
        judged = feedback if isinstance(feedback, list) and feedback else None
        cut = len(judged) if judged else len(low)
        first_bad = cut if judged and judged[-1].get("judgement") == BAD else None
        resume = divergence_index(log_turns(row["high_log"]), log_turns(row["low_log"])[:cut])
        sample = [{"role": str(m["role"]), "content": str(m["content"]), "loss": m.get("loss")}
                  for m in row["revise_log"]]
    except (KeyError, TypeError, AttributeError, IndexError):
        return None
    return {
        "high": high, "low": low, "cut": low[cut - 1] if cut else None,
        "first_bad": low[first_bad - 1] if first_bad else None, "first_bad_step": first_bad,
        "splice": high[resume] if resume < len(high) else None, "splice_step": resume + 1,
        "revision_at": HEAD_LEN + 2 * cut, "sample": sample,
    }


def tree_idx(path: Path) -> str | None:
    idx = paths.tree_index(path)
    return None if idx is None else str(idx)


def page_data(root: Node, path: Path, rows: list[dict] | None, task: str | None = None,
              index_href: str | None = None) -> dict[str, Any]:
    """Everything one page shows. ``rows``: revision rows to match (None = no
    revision data given); a row counts for this tree when its ``task_num`` is
    the file's index (any row, for a file not named search_results_<idx>)."""
    solved = max_score(root, path, task)
    nodes, index = node_table(root, solved)
    pairs, unmatched = [], 0
    if rows:
        paths, idx = PathIndex(root, index), tree_idx(path)
        for row in rows:
            if idx is not None and str(row.get("task_num")) != idx:
                continue
            view = pair_view(row, paths)
            if view is not None:
                pairs.append(view)
            elif idx is not None:
                unmatched += 1
    leaves = [n for n in nodes if n["kind"] in ("success", "fail")]
    return {
        "name": path.name, "index": index_href, "max_score": solved, "revisions": rows is not None,
        "head": [{"role": str(m.get("role")), "content": str(m.get("content"))}
                 for m in root.state[:HEAD_LEN] if isinstance(m, dict)],
        "summary": {"nodes": len(nodes), "leaves": len(leaves), "max_depth": max(n["depth"] for n in nodes),
                    "successes": sum(n["kind"] == "success" for n in leaves), "pairs": len(pairs)},
        "nodes": nodes, "pairs": pairs, "unmatched": unmatched,
    }


def script_json(data: Any) -> str:
    """JSON that cannot end its <script> element: no '<', '>' or '&' appears
    raw (an observation may well contain '</script>'). ASCII only, so a lone
    surrogate in a junk model turn cannot stop the page being written as UTF-8."""
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(data: dict[str, Any], title: str) -> str:
    fill = {"TITLE": html.escape(title), "DATA": script_json(data)}
    return re.sub(r"__(TITLE|DATA)__", lambda m: fill[m.group(1)], TEMPLATE.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- files

def read_revisions(files: list[str]) -> list[dict] | None:
    """Revision rows (not good-only rows) of path_collection.py JSONL files."""
    return read_rows(files)[0] if files else None


def write_tree_page(tree: Path, out: Path, rows: list[dict] | None, task: str | None = None,
                    index_href: str | None = None) -> dict[str, Any]:
    """Write one page; returns its data's summary (and unmatched row count).
    Raises TreeFormatError for a file that is not a tree."""
    data = page_data(load_tree(tree), tree, rows, task, index_href)
    atomic_write_text(out, render_page(data, f"{tree.parent.name}/{tree.name}"))
    return {**data["summary"], "unmatched": data["unmatched"]}


def write_index(out_dir: Path, title: str, entries: list[tuple[str, dict | str]], revisions: bool) -> Path:
    """index.html: one table row per tree, linking its page (or saying why it
    has none). Plain HTML: a run has tens to thousands of trees, no script needed."""
    head = ["tree", "nodes", "leaves", "successful leaves", "max depth"] + (["revision pairs"] if revisions else [])
    lines = [f"<tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>"]
    for href, info in entries:
        link = f'<a href="{html.escape(href)}">{html.escape(href[:-5])}</a>'
        if isinstance(info, str):
            lines.append(f'<tr class="failed"><td>{html.escape(href[:-5])}</td>'
                         f'<td colspan="{len(head) - 1}">{html.escape(info)}</td></tr>')
            continue
        cells = [info["nodes"], info["leaves"], info["successes"], info["max_depth"]]
        cells += [info["pairs"]] if revisions else []
        cls = "solved" if info["successes"] else "unsolved"
        lines.append(f'<tr class="{cls}"><td>{link}</td>{"".join(f"<td>{c}</td>" for c in cells)}</tr>')
    style = ("body{font:13px system-ui,sans-serif;margin:16px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}"
             "tr.solved td:first-child{border-left:4px solid #23932a}tr.unsolved td:first-child{border-left:4px solid "
             "#c0392b}tr.failed{color:#a00}")
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            f'<p>{len(entries)} trees</p><table id="trees">{"".join(lines)}</table></body></html>\n')
    atomic_write_text(paths.viewer_index(out_dir), page)
    return paths.viewer_index(out_dir)


def write_folder(folder: Path, out_dir: Path, rows: list[dict] | None, task: str | None = None
                 ) -> tuple[Path, list[tuple[str, dict | str]]]:
    """A page per tree under ``folder`` (the same sub-folders under
    ``out_dir``) and index.html; a file that is not a tree is listed in the
    index with its error, and the other pages are still written."""
    trees = paths.find_tree_files(folder)
    if not trees:
        raise UsageError(f"{folder} holds no search_results_<idx>.json tree: point at mcts_collection.py's "
                         "output folder (or one above it)")
    entries: list[tuple[str, dict | str]] = []
    for tree in trees:
        page = paths.viewer_page(out_dir, tree.relative_to(folder))
        rel = page.relative_to(out_dir)
        try:
            info = write_tree_page(tree, page, rows, task, os.path.relpath(paths.viewer_index(out_dir), page.parent))
        except TreeFormatError as exc:
            info = str(exc)
        entries.append((rel.as_posix(), info))
    return write_index(out_dir, f"search trees: {folder}", entries, rows is not None), entries


# --------------------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_r.view", description=__doc__.split("\n\n")[0],
                                epilog="docs/viewer.md has a screenshot and what every colour means.")
    p.add_argument("tree", help="a search_results_<idx>.json tree, or a folder: every tree under it")
    p.add_argument("-o", "--output", required=True,
                   help="the page to write (for a tree), or the folder for index.html and the pages (for a folder)")
    p.add_argument("--revisions", nargs="+", default=[], metavar="DATA.jsonl",
                   help="path_collection.py output: its revision pairs of each tree are marked on the page")
    p.add_argument("--task", choices=TASKS, help="the environment, which says what score is a success "
                   "(default: the folder name mcts_result/<task>/..., else the scores' scale)")
    args = p.parse_args(argv)
    source, out = Path(args.tree), Path(args.output)
    rows = read_revisions(args.revisions)
    if source.is_dir():
        if out.exists() and not out.is_dir():
            raise UsageError(f"-o {out} is a file: for a folder of trees give a folder for the pages")
        index, entries = write_folder(source, out, rows, args.task)
        failed = [href.removesuffix(".html") + ".json" for href, info in entries if isinstance(info, str)]
        print(f"wrote {len(entries) - len(failed)} tree pages and {index}")
        if rows is not None:
            pairs = sum(info["pairs"] for _, info in entries if isinstance(info, dict))
            print(f"revision pairs shown: {pairs} of {len(rows)} rows")
        if failed:
            print(f"error: {len(failed)} file(s) are not trees (see the index): {', '.join(failed)}", file=sys.stderr)
            return EXIT_ITEMS_FAILED
        return EXIT_OK
    if not source.is_file():
        raise UsageError(f"{source} does not exist: give a search_results_<idx>.json tree or a folder of them")
    if out.is_dir():
        out = paths.viewer_page(out, source.name)
    info = write_tree_page(source, out, rows, args.task)
    print(f"wrote {out} ({info['nodes']} nodes, {info['leaves']} leaves, {info['successes']} successful"
          + (f", {info['pairs']} revision pairs" if rows is not None else "") + ")")
    if info["unmatched"]:
        print(f"warning: {info['unmatched']} revision row(s) of this tree's index match none of its paths "
              "(data from another search?)", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    run_cli(main)
