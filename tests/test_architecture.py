"""The house's shape: imports point one way, with no circle anywhere in the library."""

import ast
import tomllib
from pathlib import Path

from tests.conftest import REPO

LIBRARY = ("benchmark.py", "train.py")  # and every package below the repository


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> dict[str, Path]:
    """Every module of the library by name: the top-level scripts, and the packages' sources and extension stubs
    (data.jpeg._jpeg is C, its interface a .pyi)."""
    packages = [path.parent for path in REPO.glob("*/__init__.py") if path.parent.name not in ("tests", "bench")]
    files = [REPO / name for name in LIBRARY]
    for package in [*packages, REPO / "hydra_plugins"]:
        files += [*package.rglob("*.py"), *package.rglob("*.pyi")]
    return {module_name(path): path for path in files}


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The library modules `path` imports, anywhere in it (a function's import is an edge too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= {name if name in modules else node.module for name in named}
    return found & modules.keys()


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_import_circle_anywhere_in_the_library():
    modules = library_modules()
    graph = {name: imports(path, modules) - {name} for name, path in modules.items()}
    assert {"train", "configs.schema", "data.jpeg._jpeg", "hydra_plugins.rn50perf_slurm"} <= graph.keys()
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_architecture_page_names_every_room_of_the_tree():
    """docs/architecture.md's table of rooms holds the library's top-level modules and packages, and names nothing
    the tree lacks (a subpackage such as data/jpeg/ may have its own row)."""
    page = (REPO / "docs" / "architecture.md").read_text()
    rows = {line.split("`")[1] for line in page.splitlines() if line.startswith("| `")}
    packages = {f"{path.parent.name}/" for path in REPO.glob("*/__init__.py")} - {"tests/", "bench/"}
    rooms = {*LIBRARY, *packages, "hydra_plugins/"}
    assert rooms <= rows
    assert all((REPO / row).exists() for row in rows)


def test_the_type_check_covers_every_room():
    """`make lint` runs mypy strict over the files pyproject.toml lists: every room of the library is among them."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")} - {"tests", "bench"}
    assert {*LIBRARY, *packages, "hydra_plugins"} <= listed
