"""The module import graph of greenserve, read with ``ast`` from the sources.

Every ``import`` and ``from ... import`` counts, also those inside functions: a function-local import
hides a cycle from the interpreter but not from a reader. The graph has one node per module of
``greenserve`` (services/) and an edge for each import of another greenserve module.
"""
from __future__ import annotations

import ast
from pathlib import Path

import greenserve

ROOT = Path(greenserve.__file__).resolve().parent
PACKAGE = "greenserve"

# Cycles that still exist, each as the sorted modules of one strongly connected component. The test
# fails on any other cycle, and on a listed one that is gone (so this list only shrinks).
KNOWN_CYCLES: set[frozenset[str]] = {frozenset(c) for c in (
)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))
            if "migrations" not in p.relative_to(ROOT).parts}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The greenserve modules that ``name`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    # Imports under ``if TYPE_CHECKING:`` never run; they name types for the checker only.
    type_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                 for stmt in block.body for n in ast.walk(stmt)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod.
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def strongly_connected(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; the components with more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_not_a_chain() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_function_local_imports() -> None:
    g = graph()
    # router_launch imports router_engine only inside a function.
    assert "greenserve.bench.router_engine" in g["greenserve.bench.router_launch"]


def test_no_new_import_cycle() -> None:
    cycles = {frozenset(c) for c in strongly_connected(graph())}
    new = cycles - KNOWN_CYCLES
    gone = KNOWN_CYCLES - cycles
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)
    assert not gone, "cycles no longer present, remove them from KNOWN_CYCLES:\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in gone)


def test_the_product_does_not_import_the_benchmarks() -> None:
    g = graph()
    offenders = sorted(f"{m} -> {t}" for m, targets in g.items() if not m.startswith("greenserve.bench")
                       for t in targets if t.startswith("greenserve.bench"))
    assert not offenders, "\n".join(offenders)


# The six services. Each may import its own modules and the shared libraries only: common (shared
# domain code and plumbing), v1 (generated protobuf) and simulator (the performance models the
# optimizer, profiler and GPU partitioner plan with). evaluation, bench and vllm_cpu are harnesses that
# may import any service; no service or library imports them.
SERVICES = {"forecaster", "profiler", "optimizer", "cache_manager", "gpu_partitioner", "router"}
LIBRARIES = {"common", "v1", "simulator"}
# Library modules that still reach into a service, as (importer, imported).
KNOWN_CROSSINGS: set[tuple[str, str]] = set()


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_service_imports_another_service() -> None:
    crossings = set()
    for module, targets in graph().items():
        area = _area(module)
        for target in targets:
            to = _area(target)
            if to == area or to == "":
                continue
            if (area in SERVICES and to not in LIBRARIES) or (area in LIBRARIES and to not in LIBRARIES):
                crossings.add((module, target))
    new = crossings - KNOWN_CROSSINGS
    assert not new, "\n".join(f"{a} -> {b}" for a, b in sorted(new))
    assert not KNOWN_CROSSINGS - crossings, f"no longer crossing, remove: {sorted(KNOWN_CROSSINGS - crossings)}"
