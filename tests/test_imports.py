"""The house of imports: no import cycle anywhere in the kit, a command-line module imported only to be run, and
build/ and training/ meeting only in the build chain.

The walk reads every module of the kit's packages with `ast` (nothing is imported or run): every `import` and
`from ... import` statement counts, at module level and inside functions, classes and `if` blocks alike (a
function-level import hides a cycle from the interpreter, not from the reader). Relative imports are resolved against
the importing module's package. `import a.b` is an edge to `a.b`; `from a import b` is an edge to `a.b` when `a.b` is
a module of the kit, else to `a`. Only edges between the kit's own modules count; importing a package does not add
edges to the packages above it (every module of a package would otherwise "cycle" through its `__init__`).
Imports made by name at run time (`importlib`, `python -m` in a subprocess) are not seen.

A command-line module is a module whose job is to be run: a `__main__.py`, or a module with a module-level
`if __name__ == "__main__":` block, unless it is one of TOOLS, the runnable modules that are also imported for their
functions by design (`build.quantize.quantizer`'s `quantize`, `training.rft`'s `load_config`: libraries with a
command line beside). Every other module is a library. Two rules follow:
- a library imports no command-line module: that would tie it to argument parsing, deadlines and exits that its
  caller did not ask for (issue 30: `make_engine` lived in `submission/main.py`);
- a command-line module imports another one only for its entry (`main`, or `run` for parsed arguments: a
  dispatcher, or a command that runs another in its process); whatever else they share belongs in a library.
  `import x` and `from package import x` of a command-line module count as taking its entry (the walk does not
  follow attribute use).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("build", "training", "submission", "sim", "conformance", "offline_wheels", "benchmarks")
# runnable modules imported for their functions by design (see the module docstring); each entry must be runnable
TOOLS = frozenset({
    "build.bundle.bundler", "build.models.grid_vocab", "build.models.tiny", "build.patch_eot", "build.pipeline",
    "build.prune.calibrate", "build.prune.pruner", "build.quantize.quantizer", "offline_wheels.lock", "sim.example_log",
    "submission.sandbox.client", "submission.score", "training.dataset", "training.rft"})
ENTRIES = frozenset({"main", "run"})  # what one command-line module may import from another


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kit_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Module name -> file, for every .py file of the walked packages."""
    return {module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}


def imported_names(name: str, path: Path, modules: set[str]) -> dict[str, set[str]]:
    """The kit modules `name` (at `path`) imports anywhere in its file, resolved as the module docstring says, each
    with the names taken from it by `from ... import` (empty for a whole module: `import x`, `from package import
    x`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, set())
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    found.setdefault(f"{source}.{alias.name}", set())
                else:
                    found.setdefault(source, set()).add(alias.name)
    return {m: names for m, names in found.items() if m in modules and m != name}  # `from . import x` names x only


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The kit modules `name` (at `path`) imports."""
    return set(imported_names(name, path, modules))


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


def runnable(path: Path) -> bool:
    """A `__main__.py`, or a module with a module-level `if __name__ == "__main__":` block."""
    if path.name == "__main__.py":
        return True
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
               for node in ast.parse(path.read_text(), str(path)).body)


def command_import_problems(modules: dict[str, Path], tools: frozenset[str] = TOOLS) -> list[str]:
    """Every import that breaks the two rules of the module docstring, as `importer -> imported`."""
    commands = {name for name, path in modules.items() if runnable(path) and name not in tools}
    found = []
    for name, path in sorted(modules.items()):
        for target, names in sorted(imported_names(name, path, set(modules)).items()):
            if target not in commands:
                continue
            if name not in commands:
                found.append(f"{name} -> {target} (a library importing a command-line module)")
            elif names - ENTRIES:
                found.append(f"{name} -> {target} ({', '.join(sorted(names - ENTRIES))}: a command-line module "
                             "importing more than another's entry)")
    return found


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


def test_the_command_rules_on_a_package_written_here(tmp_path):
    """The two rules on a package written here: a library importing a command, a command taking a helper from
    another, and what passes: a dispatcher importing entries, a tool imported by a library."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "__init__.py").write_text("")
    main = 'def main():\n    pass\n\n\nif __name__ == "__main__":\n    main()\n'
    (kit / "__main__.py").write_text("from kit.a import main\nfrom kit import b\nfrom kit.c import run\n")
    (kit / "a.py").write_text("from kit.lib import helper\n" + main)
    (kit / "b.py").write_text("from kit.a import main, helper\n" + main)
    (kit / "c.py").write_text("def run():\n    from kit.tool import work\n" + main)
    (kit / "tool.py").write_text("work = 1\n" + main)
    (kit / "lib.py").write_text("from kit.tool import work\nhelper = 1\ndef f():\n    from kit.c import run\n")
    modules = kit_modules(tmp_path, ("kit",))
    assert command_import_problems(modules, frozenset({"kit.tool"})) == [
        "kit.b -> kit.a (helper: a command-line module importing more than another's entry)",
        "kit.lib -> kit.c (a library importing a command-line module)"]
    assert command_import_problems(modules, frozenset()) == [
        "kit.b -> kit.a (helper: a command-line module importing more than another's entry)",
        "kit.c -> kit.tool (work: a command-line module importing more than another's entry)",
        "kit.lib -> kit.c (a library importing a command-line module)",
        "kit.lib -> kit.tool (a library importing a command-line module)"]


def test_tools_are_runnable_modules():
    """TOOLS names only runnable modules of the kit, so a stale entry cannot hide a command."""
    modules = kit_modules()
    assert sorted(t for t in TOOLS if t not in modules or not runnable(modules[t])) == []


def test_no_command_line_module_imported_but_to_run_it():
    found = command_import_problems(kit_modules())
    assert not found, "imports of command-line modules:\n" + "\n".join(found)


def test_build_and_training_meet_only_in_the_build_chain():
    """Training calls the build chain (`build.pipeline`: prune -> patch -> quantise, as RFT's merge does); nothing
    else of build/ imports training/ or is imported by it, so each can change without the other."""
    graph = import_graph(kit_modules())
    found = sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                   if {name.split(".")[0], target.split(".")[0]} == {"build", "training"}
                   and not (name.startswith("training.") and target == "build.pipeline"))
    assert not found, "build and training importing each other outside build.pipeline:\n" + "\n".join(found)


def test_the_probe_runs_the_solver_through_its_library_function():
    """training.corpus.probe runs the solver through submission.lines.run_profile (what submission.main calls), not
    through the command line's entry and its argument list (issue 46)."""
    modules = kit_modules()
    imported = imports_of("training.corpus.probe", modules["training.corpus.probe"], set(modules))
    assert "submission.lines" in imported and "submission.main" not in imported


# The rooms of submission/ (issue 46), lowest first: each room's modules (a name ending in "." is a package prefix)
# and the rooms it may import besides its own. The core imports no line; a line imports neither the other line nor
# the profiles that name both; the runs (libraries: each line's run, the combined run, the merge, `lines` that
# dispatches a profile to its run) stand on the profiles; the entries (the command lines users type) only parse
# arguments and call a run; the Kaggle runtime checks bundles against the profiles but imports no run and no entry
# (boot starts the entries as processes). The reasoning line's engines (reasoning/engines/) are the line's own: no
# other room drives a chat engine.
ROOMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "core": (frozenset({"submission", "submission.grids", "submission.tasks", "submission.views", "submission.score",
                        "submission.selection", "submission.answer_file", "submission.strict_toml",
                        "submission.attempts", "submission.schedule", "submission.heartbeat", "submission.processes",
                        "submission.progress", "submission.engine_numbers", "submission.cli"}), frozenset()),
    "sandbox": (frozenset({"submission.sandbox", "submission.sandbox."}), frozenset({"core"})),
    "reasoning line": (frozenset({"submission.reasoning", "submission.reasoning."}), frozenset({"core", "sandbox"})),
    "grid line": (frozenset({"submission.grid", "submission.grid."}), frozenset({"core"})),
    "profiles": (frozenset({"submission.profiles"}), frozenset({"core", "sandbox", "reasoning line", "grid line"})),
    "runs": (frozenset({"submission.reasoning.run", "submission.grid.run", "submission.both", "submission.both.run",
                        "submission.merge", "submission.lines"}),
             frozenset({"core", "sandbox", "reasoning line", "grid line", "profiles"})),
    "entries": (frozenset({"submission.main", "submission.grid.main", "submission.both.__main__"}),
                frozenset({"core", "reasoning line", "grid line", "profiles", "runs"})),
    "kaggle": (frozenset({"submission.kaggle", "submission.kaggle."}),
               frozenset({"core", "reasoning line", "grid line", "profiles"})),
    "aliases": (frozenset({"submission.boot", "submission.preflight", "submission.kaggle_mounts",
                           "submission.library"}), frozenset({"kaggle", "sandbox"})),
}


def room_of(module: str) -> list[str]:
    """The rooms whose lists name `module` (exactly one for every module of submission/; the exact name wins over a
    package prefix, so `submission.grid.run` is a run, not the grid line)."""
    exact = [room for room, (members, _) in ROOMS.items() if module in members]
    return exact or [room for room, (members, _) in ROOMS.items()
                     if any(m.endswith(".") and module.startswith(m) for m in members)]


def test_every_module_of_submission_has_one_room():
    found = {name: room_of(name) for name in kit_modules() if name.split(".")[0] == "submission"}
    assert {name: rooms for name, rooms in found.items() if len(rooms) != 1} == {}


def test_the_runs_are_libraries_and_the_entries_command_lines():
    """A run is called (submission.lines dispatches a profile to it), so it is a library; an entry is what users type
    (`python -m submission.main`, `submission.grid.main`, `submission.both`), so it is runnable and, being no tool,
    nothing imports it but to run it (issue 46: the grid line's and the combined run were commands imported for
    their `run`)."""
    modules = kit_modules()
    rooms = {name: room_of(name)[0] for name in modules if name.split(".")[0] == "submission"}
    assert sorted(n for n, room in rooms.items() if room == "runs" and runnable(modules[n])) == []
    assert sorted(n for n, room in rooms.items() if room == "entries") == [
        "submission.both.__main__", "submission.grid.main", "submission.main"]
    assert all(runnable(modules[n]) and n not in TOOLS for n, room in rooms.items() if room == "entries")


def room_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a submission/ module against the rooms, as `importer (room) -> imported (room)`."""
    found = []
    for name, targets in sorted(graph.items()):
        if name.split(".")[0] != "submission":
            continue
        room = room_of(name)[0]
        for target in sorted(targets):
            if target.split(".")[0] != "submission":
                found.append(f"{name} -> {target} (submission/ imports nothing of the kit outside it)")
            elif room_of(target)[0] not in ROOMS[room][1] | {room}:
                found.append(f"{name} ({room}) -> {target} ({room_of(target)[0]})")
    return found


def test_no_room_of_submission_imports_one_above_it():
    found = room_problems(import_graph(kit_modules()))
    assert not found, "imports against the rooms of submission/:\n" + "\n".join(found)


def test_every_folder_of_submission_says_what_lives_there_and_what_it_must_not_import():
    """Each package's `__init__` docstring is a folder's door sign (issue 46): what lives there, and a "Must not
    import" sentence, so a new folder cannot arrive without one."""
    found = [name for name, path in kit_modules().items()
             if name.split(".")[0] == "submission" and path.name == "__init__.py"
             and "Must not import" not in (ast.get_docstring(ast.parse(path.read_text())) or "")]
    assert found == []


def test_the_room_rule_catches_an_upward_import():
    """The rule itself on the real graph with edges added: the core importing the reasoning line, a line importing
    the other, the Kaggle runtime importing a run, submission/ importing build/ are each reported."""
    graph = {name: set(targets) for name, targets in import_graph(kit_modules()).items()}
    graph["submission.grids"].add("submission.reasoning.profile")
    graph["submission.reasoning.prompt"].add("submission.grid.format")
    graph["submission.kaggle.boot"].add("submission.main")
    graph["submission.tasks"].add("build.tiny")
    assert room_problems(graph) == [
        "submission.grids (core) -> submission.reasoning.profile (reasoning line)",
        "submission.kaggle.boot (kaggle) -> submission.main (entries)",
        "submission.reasoning.prompt (reasoning line) -> submission.grid.format (grid line)",
        "submission.tasks -> build.tiny (submission/ imports nothing of the kit outside it)"]


# The rooms of build/ (issue 46), lowest first, as ROOMS is for submission/: each room's modules (a name ending in "."
# is a package prefix) and the rooms it may import besides its own. The core (a checkpoint's files, its schemes'
# formats, the layer-by-layer runner, the end-of-turn patch) imports no room; models/, quantize/ and bundle/ stand on
# the core alone; prune/ reads quantize/'s formats and report (it prunes compressed-tensors checkpoints); the chain
# (the pipeline and the likelihood check of what it makes) may import every room; the one-release aliases of moved
# commands run their room's module. Of the rest of the kit build/ imports only submission/ and offline_wheels/ (what
# a bundle must satisfy, the solver's prompts for calibration, the wheels it ships); training/ calls build.pipeline.
BUILD_ROOMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "core": (frozenset({"build", "build.checkpoint", "build.schemes", "build.layerwise", "build.patch_eot"}),
             frozenset()),
    "models": (frozenset({"build.models", "build.models."}), frozenset({"core"})),
    "quantize": (frozenset({"build.quantize", "build.quantize."}), frozenset({"core"})),
    "prune": (frozenset({"build.prune", "build.prune."}), frozenset({"core", "quantize"})),
    "bundle": (frozenset({"build.bundle", "build.bundle."}), frozenset({"core"})),
    "chain": (frozenset({"build.pipeline", "build.check_quality"}),
              frozenset({"core", "models", "quantize", "prune", "bundle"})),
    "aliases": (frozenset({"build.tiny", "build.grid_vocab", "build.calibrate", "build.experts", "build.adoption",
                           "build.notebook"}), frozenset({"models", "prune", "bundle"})),
}


def build_room_of(module: str, rooms: dict[str, tuple[frozenset[str], frozenset[str]]] = BUILD_ROOMS) -> list[str]:
    """The rooms of build/ whose lists name `module` (exactly one for every module of build/; an exact name wins over
    a package prefix)."""
    exact = [room for room, (members, _) in rooms.items() if module in members]
    return exact or [room for room, (members, _) in rooms.items()
                     if any(m.endswith(".") and module.startswith(m) for m in members)]


def test_every_module_of_build_has_one_room():
    found = {name: build_room_of(name) for name in kit_modules() if name.split(".")[0] == "build"}
    assert {name: rooms for name, rooms in found.items() if len(rooms) != 1} == {}


def build_room_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a build/ module against its rooms, as `importer (room) -> imported (room)`."""
    found = []
    for name, targets in sorted(graph.items()):
        if name.split(".")[0] != "build":
            continue
        room = build_room_of(name)[0]
        for target in sorted(targets):
            if target.split(".")[0] not in ("build", "submission", "offline_wheels"):
                found.append(f"{name} -> {target} (build/ imports of the kit only submission/ and offline_wheels/)")
            elif target.split(".")[0] == "build" and build_room_of(target)[0] not in BUILD_ROOMS[room][1] | {room}:
                found.append(f"{name} ({room}) -> {target} ({build_room_of(target)[0]})")
    return found


def test_no_room_of_build_imports_one_above_it():
    found = build_room_problems(import_graph(kit_modules()))
    assert not found, "imports against the rooms of build/:\n" + "\n".join(found)


def test_the_build_room_rule_catches_an_upward_import():
    """The rule itself on the real graph with edges added: the core importing a model maker, the quantiser importing
    the pruner's statistics, a model maker importing the quantiser, the bundler importing the pipeline, the
    quantiser importing the simulator are each reported; calibration importing the quantiser (allowed) is not."""
    graph = {name: set(targets) for name, targets in import_graph(kit_modules()).items()}
    graph["build.checkpoint"].add("build.models.tiny")
    graph["build.quantize.quantizer"].add("build.prune.stats")
    graph["build.models.tiny"].add("build.quantize.fused")
    graph["build.bundle.bundler"].add("build.pipeline")
    graph["build.quantize.quantizer"].add("sim.example_log")
    graph["build.prune.calibrate"].add("build.quantize.quantizer")
    assert build_room_problems(graph) == [
        "build.bundle.bundler (bundle) -> build.pipeline (chain)",
        "build.checkpoint (core) -> build.models.tiny (models)",
        "build.models.tiny (models) -> build.quantize.fused (quantize)",
        "build.quantize.quantizer (quantize) -> build.prune.stats (prune)",
        "build.quantize.quantizer -> sim.example_log (build/ imports of the kit only submission/ and offline_wheels/)"]
