"""The module import graph of src/lmperf: no cycles (lazy imports inside functions included),
and the results layer never imports torch."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in (SRC / "lmperf").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the lmperf modules it imports anywhere in its body (a package importing its
    own submodules is not counted: that is the package's face, not a dependency)."""
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package[: len(package) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = owner(name) if name.startswith("lmperf") else None
                if target and target != m and not target.startswith(m + "."):
                    graph[m].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def package_of(module: str) -> str:
    """The package a module belongs to at the level of the architecture: lmperf.core,
    lmperf.workload, ..., and each question on its own (lmperf.questions.bench, ...)."""
    parts = module.split(".")
    depth = 3 if len(parts) >= 3 and parts[1] == "questions" else 2
    return ".".join(parts[:depth])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to packages (lmperf/__init__ itself, the lazy face of the
    API, left out)."""
    packages: dict[str, set[str]] = {}
    for m, targets in graph.items():
        if m == "lmperf":
            continue
        a = package_of(m)
        packages.setdefault(a, set())
        packages[a] |= {package_of(t) for t in targets if t != "lmperf"} - {a}
    for targets in list(packages.values()):
        for t in targets:
            packages.setdefault(t, set())
    return packages


def test_no_package_level_import_cycles():
    assert cycles(package_graph(import_graph())) == []


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_results_never_import_torch():
    for f in (SRC / "lmperf" / "results").rglob("*.py"):
        tree = ast.parse(f.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom)}
        assert "torch" not in imported, f
