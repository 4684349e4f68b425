"""The import structure DESIGN.md fixes: no package imports upward, and no import cycle inside a
package (function-level imports count: they are the same dependency, deferred)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("lazy_core", "lowerings", "runtime", "lazy_torch")
# What each package may import of the others and of the frameworks (DESIGN.md, "Layers").
MAY_IMPORT = {
    "lazy_core": set(),
    "lowerings": {"lazy_core", "jax"},
    "runtime": {"lazy_core", "lowerings", "jax"},
    "lazy_torch": {"lazy_core", "runtime", "torch"},
}
FRAMEWORKS = ("torch", "jax")


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return (
        path.with_suffix(".py").exists()
        or (path / "__init__.py").exists()
        or any(path.parent.glob(path.name + ".*.so"))
    )


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of this project and the frameworks it imports, anywhere in it."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):  # subpackages too (lazy_torch.distributed)
            names = found.setdefault(_module(path), set())
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for a in node.names:  # ``from pkg import module`` imports the module
                        full = f"{node.module}.{a.name}"
                        names.add(full if _is_module(full) else node.module)
    return found


def test_no_package_imports_upward():
    wrong = []
    for module, names in _imports().items():
        package = module.split(".")[0]
        for name in names:
            top = name.split(".")[0]
            if top != package and top in (*PACKAGES, *FRAMEWORKS):
                if top not in MAY_IMPORT[package]:
                    wrong.append(f"{module} imports {name}")
    assert not wrong, wrong


# JAX's private package, by its parts (DESIGN.md: public ``jax`` APIs only, never that one).
PRIVATE_JAX = ("jax", "_src")


def test_only_jax_public_api_is_imported():
    """DESIGN.md: public ``jax`` APIs only, never JAX's private ``_src`` package."""
    private = [
        f"{module} imports {name}"
        for module, names in _imports().items()
        for name in names
        if tuple(name.split(".")[:2]) == PRIVATE_JAX
    ]
    assert not private, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for child in edges:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
                        components.append(sorted(component))
    return components


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package):
    inside = {
        module: {n for n in names if n.split(".")[0] == package and n != package}
        for module, names in _imports().items()
        if module.split(".")[0] == package and module != package
    }
    assert _cycles(inside) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
