"""The house of imports: no import cycle anywhere in the kit, and no library module importing a command-line module.

The walk reads every module of the kit's packages with `ast` (nothing is imported or run): every `import` and
`from ... import` statement counts, at module level and inside functions, classes and `if` blocks alike (a
function-level import hides a cycle from the interpreter, not from the reader). Relative imports are resolved against
the importing module's package. `import a.b` is an edge to `a.b`; `from a import b` is an edge to `a.b` when `a.b` is
a module of the kit, else to `a`. Only edges between the kit's own modules count; importing a package does not add
edges to the packages above it (every module of a package would otherwise "cycle" through its `__init__`).
Imports made by name at run time (`importlib`, `python -m` in a subprocess) are not seen.

A command-line module is a module whose job is to be run, not imported for its functions: a `__main__.py`, a module
named `main.py` or `cli.py`, and every runnable module under benchmarks/ (one with `if __name__ == "__main__":`).
Other modules with a command (`python -m build.quantize`) are tools: libraries with a `main()` beside their
functions, importing them for those functions is by design. A library module is every module that is not a
command-line module; a library importing a command-line module ties the library to argument parsing, deadlines
and exits that a caller did not ask for (issue 30: `make_engine` lived in `submission/main.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("build", "training", "submission", "sim", "conformance", "offline_wheels", "benchmarks")
COMMAND_NAMES = ("__main__", "main", "cli")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kit_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Module name -> file, for every .py file of the walked packages."""
    return {module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The kit modules `name` (at `path`) imports anywhere in its file, resolved as the module docstring says."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return {m for m in found if m in modules and m != name}  # a package naming itself (`from . import x`) is none


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: each holds a cycle (Tarjan's algorithm, iterative
    so a deep chain cannot exhaust the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
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
                    components.append(sorted(component))
    return sorted(components)


def cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for step in sorted(graph[node] & component):
                if step == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1] + [start]
                if step not in came_from:
                    came_from[step] = node
                    following.append(step)
        frontier = following
    raise AssertionError(f"{sorted(component)} is no cycle")


def is_command(name: str, path: Path) -> bool:
    """A command-line module, as the module docstring defines it."""
    if path.stem in COMMAND_NAMES:
        return True
    return name.startswith("benchmarks.") and '__name__ == "__main__"' in path.read_text()


def test_the_walk_resolves_every_kind_of_import(tmp_path):
    """The walker itself, on a package written here: module-level, function-level, relative, `from package import
    module`, and a name that is no module."""
    kit = tmp_path / "kit"
    (kit / "sub").mkdir(parents=True)
    (kit / "__init__.py").write_text("from kit import c\n")
    (kit / "sub" / "__init__.py").write_text("from .a import thing\n")
    (kit / "sub" / "a.py").write_text("import os\nthing = 1\ndef f():\n    from kit.sub import b\n")
    (kit / "sub" / "b.py").write_text("from . import a\nfrom ..sub.a import thing\n")
    (kit / "c.py").write_text("if True:\n    import kit.sub.a\nfrom kit.sub import thing\n")
    graph = import_graph(kit_modules(tmp_path, ("kit",)))
    assert graph == {"kit": {"kit.c"}, "kit.sub": {"kit.sub.a"}, "kit.sub.a": {"kit.sub.b"},
                     "kit.sub.b": {"kit.sub.a"}, "kit.c": {"kit.sub.a", "kit.sub"}}
    assert components(graph) == [["kit.sub.a", "kit.sub.b"]]
    assert cycle_in(graph, {"kit.sub.a", "kit.sub.b"}) == ["kit.sub.a", "kit.sub.b", "kit.sub.a"]


def test_no_import_cycle():
    graph = import_graph(kit_modules())
    found = [f"{' -> '.join(cycle_in(graph, set(c)))} (all of {', '.join(c)} reach each other)"
             for c in components(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_library_imports_a_command_line_module():
    modules = kit_modules()
    graph = import_graph(modules)
    commands = {name for name, path in modules.items() if is_command(name, path)}
    found = sorted(f"{name} -> {target}" for name, targets in graph.items() if name not in commands
                   for target in sorted(targets & commands))
    assert not found, "library modules importing command-line modules:\n" + "\n".join(found)


def test_build_and_training_meet_only_in_the_build_chain():
    """Training calls the build chain (`build.pipeline`: prune -> patch -> quantise, as RFT's merge does); nothing
    else of build/ imports training/ or is imported by it, so each can change without the other."""
    graph = import_graph(kit_modules())
    found = sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                   if {name.split(".")[0], target.split(".")[0]} == {"build", "training"}
                   and not (name.startswith("training.") and target == "build.pipeline"))
    assert not found, "build and training importing each other outside build.pipeline:\n" + "\n".join(found)
