"""The house's shape: imports point one way, down the floors docs/architecture.md draws, with no circle anywhere in
the library."""

import ast
import re
import tomllib
from pathlib import Path

from tests.conftest import REPO

LIBRARY = ("benchmark.py", "ending.py", "project.py", "starting.py", "train.py")  # and every package below them


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


def rooms() -> set[str]:
    """The rooms of the tree as docs/architecture.md names them: `train.py`, `backends/`."""
    packages = {f"{path.parent.name}/" for path in REPO.glob("*/__init__.py")} - {"tests/", "bench/"}
    return {*LIBRARY, *packages, "hydra_plugins/"}


def floors(page: str) -> dict[str, int]:
    """Each room's floor, from the page's table of floors: a row `| 2 | `models/`, `optim/` | ... |` puts the rooms
    its second cell names in backticks on floor 2."""
    found: dict[str, int] = {}
    for line in page.splitlines():
        if row := re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line):
            for room in re.findall(r"`([^`]+)`", row[2]):
                assert room not in found, f"{room} stands on two floors of docs/architecture.md"
                found[room] = int(row[1])
    return found


def room_of(module: str, floors: dict[str, int]) -> str:
    """A module's room: its top-level module (`train.py`) or package (`projection/` for projection.ipu.partition)."""
    top = module.split(".")[0]
    return f"{top}.py" if f"{top}.py" in floors else f"{top}/"


def config_module(module: str) -> bool:
    """A component's section of the configuration, `<room>/config.py` (a family's: `projection/<family>/config.py`),
    or the device sections' registry and base (configs/device/): the modules any room may import."""
    return module.endswith(".config") or module.startswith("configs.device.")


def imports_not_down(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """The imports between rooms that do not point to a lower floor (`module -> module`), but for those of a config
    module."""
    return [
        f"{module} -> {other}"
        for module in sorted(graph)
        for other in sorted(graph[module])
        if room_of(other, floors) != room_of(module, floors)
        and not config_module(other)
        and floors[room_of(other, floors)] >= floors[room_of(module, floors)]
    ]


def library_graph() -> dict[str, set[str]]:
    modules = library_modules()
    return {name: imports(path, modules) - {name} for name, path in modules.items()}


def architecture_page() -> str:
    return (REPO / "docs" / "architecture.md").read_text()


def test_no_import_circle_anywhere_in_the_library():
    graph = library_graph()
    assert {"train", "configs.schema", "data.jpeg._jpeg", "hydra_plugins.rn50perf_slurm"} <= graph.keys()
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_import_between_rooms_points_down_a_floor():
    """An import from one room to another points to a lower floor of docs/architecture.md, unless it imports a config
    module (configs/schema.py composes them all; any room may read one)."""
    floor = floors(architecture_page())
    assert rooms() <= floor.keys(), "a room with no floor: test_every_room_of_the_tree_has_a_floor says which"
    assert imports_not_down(library_graph(), floor) == []


def test_the_direction_check_finds_an_import_that_does_not_point_down():
    floors = {"top.py": 3, "mid/": 2, "side/": 2, "low/": 1}
    graph = {
        "top": {"mid.a", "low.b"},
        "mid.a": {"mid.config", "low.b", "side.c"},  # across to the same floor
        "mid.config": set(),
        "side.c": set(),
        "low.b": {"low.d", "mid.config", "mid.a"},  # up, to an implementation
        "low.d": {"top"},  # up, to the top
    }
    assert imports_not_down(graph, floors) == ["low.b -> mid.a", "low.d -> top", "mid.a -> side.c"]


def test_config_modules_import_only_the_ground_floor_and_each_other():
    """Reading a config module never runs an implementation: a config module imports config modules, configs/ (the
    checks it raises) and the rooms of floor 1 only."""
    floor = floors(architecture_page())
    graph = library_graph()
    wider = [
        f"{module} -> {other}"
        for module in sorted(filter(config_module, graph))
        for other in sorted(graph[module])
        if not config_module(other) and room_of(other, floor) != "configs/" and floor[room_of(other, floor)] != 1
    ]
    assert wider == []


def test_every_room_of_the_tree_has_a_floor():
    """docs/architecture.md's floors hold every room of the tree, and name nothing the tree lacks."""
    floor = floors(architecture_page())
    assert rooms() - floor.keys() == set(), "rooms with no floor in docs/architecture.md"
    assert floor.keys() - rooms() == set(), "floors of docs/architecture.md name rooms the tree lacks"


def test_the_architecture_page_names_every_room_of_the_tree():
    """docs/architecture.md's table of rooms holds the library's top-level modules and packages, and names nothing
    the tree lacks (a subpackage such as data/jpeg/ may have its own row)."""
    rows = {line.split("`")[1] for line in architecture_page().splitlines() if line.startswith("| `")}
    assert rooms() <= rows
    assert all((REPO / row).exists() for row in rows)


def test_the_type_check_covers_every_room():
    """`make lint` runs mypy strict over the files pyproject.toml lists: every room of the library is among them."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    packages = {path.parent.name for path in REPO.glob("*/__init__.py")} - {"tests", "bench"}
    assert {*LIBRARY, *packages, "hydra_plugins"} <= listed
