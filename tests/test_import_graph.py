"""No two of the project's modules import each other, directly or through
others, at module level or inside a function: a circle means neither can be
read, tested or moved alone, and an import inside a function only hides it.

A module importing its own package (``agent_r.loop.runner`` reading
``agent_r.loop``) is how Python loads any package, not a circle."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_r", "agentenv_client", "agentenv_servers", "scripts", "bench", "reproduction")


def project_modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name an import statement anywhere in the file names."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def import_graph() -> dict[str, set[str]]:
    mods = project_modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in mods.items():
        targets = {owner(n) for n in imported_names(module, path)}
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_circle_through_a_function_level_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from agent_r.training.cpu import save_model\n    from . import sibling\n")
    assert {"agent_r.training.cpu", "agent_r.training"} <= imported_names("agent_r.training.probe", path)
    assert "agent_r.training.sibling" in imported_names("agent_r.training.probe", path)


def test_no_import_circle_among_the_projects_modules():
    graph = import_graph()
    assert len(graph) > 100 and "agent_r.training.adapter" in graph["agent_r.training.cpu"]
    assert circles(graph) == []
