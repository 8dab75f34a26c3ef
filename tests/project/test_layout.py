"""The package layout is a dependency rule: each process's code imports only downwards.

    scheduler.cli     what runs in a user's shell; may import everything below
    scheduler.daemon  the head-node daemon; may import scheduler.node (its in-process agent)
    scheduler.node    what runs on a GPU node; never imports scheduler.daemon or scheduler.cli
    scheduler.*       the shared core (store, lifecycle, carbon, accounting, simulate, ...);
                      imports none of the three process packages
    policies, telemetry  import nothing of scheduler, nor each other (../shared/DESIGN.md)

Inside scheduler.cli the verb modules and `common` never import `main`, so the command line
has no import cycle. Imports inside functions count as much as those at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scheduler", "policies", "telemetry")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every module that module `name` (the file `path`) imports, wherever the import
    statement is, as absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found.add(stem)
            found.update(f"{stem}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


MODULES = {module_name(p): imports_of(p, module_name(p)) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offenders(importer, forbidden: tuple[str, ...]) -> list[str]:
    """'A imports B' for every module A with `importer(A)` true that imports something under
    one of the `forbidden` packages."""
    return sorted(f"{mod} imports {imp}" for mod, imps in MODULES.items() if importer(mod)
                  for imp in imps if any(within(imp, f) for f in forbidden))


def in_package(package: str, but: tuple[str, ...] = ()):
    return lambda mod: within(mod, package) and mod not in but


PROCESSES = ("scheduler.cli", "scheduler.daemon", "scheduler.node")


def is_core(mod: str) -> bool:
    """The shared core: scheduler's modules outside the three process packages (the
    `python -m scheduler` entry point is the command line's)."""
    return (within(mod, "scheduler") and mod != "scheduler.__main__"
            and not any(within(mod, p) for p in PROCESSES))


def test_the_walk_sees_the_whole_tree():
    assert {"scheduler.cli.main", "scheduler.cli.common", "scheduler.daemon.main", "scheduler.node.main",
            "scheduler.node.agent", "scheduler.store.engine", "policies.solvers.cpsat", "telemetry.gpu.nvml"} <= set(MODULES)
    assert "scheduler.cli.common" in MODULES["scheduler.cli.carbon"]


def test_no_module_of_the_cli_imports_its_main():
    assert offenders(in_package("scheduler.cli", but=("scheduler.cli.main",)), ("scheduler.cli.main",)) == []


def test_nothing_below_the_cli_imports_it():
    def outside(mod: str) -> bool:
        return not within(mod, "scheduler.cli") and mod != "scheduler.__main__"

    assert offenders(outside, ("scheduler.cli",)) == []


def test_the_node_imports_nothing_of_the_daemon():
    assert offenders(in_package("scheduler.node"), ("scheduler.daemon", "scheduler.cli")) == []


def test_the_shared_core_imports_no_process_package():
    assert any(is_core(m) for m in ("scheduler.accounting", "scheduler.store.engine", "scheduler.process"))
    assert offenders(is_core, PROCESSES) == []


@pytest.mark.parametrize("package, others", [("policies", ("scheduler", "telemetry")),
                                             ("telemetry", ("scheduler", "policies"))])
def test_policies_and_telemetry_stand_alone(package, others):
    assert offenders(in_package(package), others) == []


def test_the_walk_would_catch_a_cycle(tmp_path):
    """The checker itself: a verb module importing `main` inside a function is reported."""
    verb = tmp_path / "scheduler" / "cli" / "verb.py"
    verb.parent.mkdir(parents=True)
    verb.write_text("def run():\n    from scheduler.cli.main import main\n    from . import main as m\n")
    assert {"scheduler.cli.main", "scheduler.cli.main.main"} <= imports_of(verb, "scheduler.cli.verb")


def test_the_command_line_starts_on_the_standard_library_alone():
    """`carbonsched VERB` imports only the standard library and the CLI's own modules before
    a verb runs: user commands start fast, even where numpy or SQLAlchemy are slow to load."""
    import subprocess
    import sys

    code = ("import sys, scheduler.cli.main as m; m.build_parser(); "
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'numpy', 'sqlalchemy', 'ortools', 'policies', "
            "'telemetry', 'simpy', 'apscheduler', 'prometheus_client', 'matplotlib'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_client_verbs_run_without_the_daemons_packages():
    """What `queue`, `show`, `cancel` and `submit` import when they run, as another user runs
    them with the system's python3 (no SQLAlchemy, numpy or OR-Tools there)."""
    import subprocess
    import sys

    code = ("import sys, scheduler.cli.output, scheduler.cli.client, scheduler.job_specs; "
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'numpy', 'sqlalchemy', 'ortools', "
            "'simpy', 'apscheduler', 'prometheus_client', 'matplotlib'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- The shape of the house: rooms, circles, sizes -------------------------------------------

ROOMS = {"scheduler.cli": 3, "scheduler.daemon": 2, "scheduler.node": 1}  # the core is 0


def room_of(mod: str) -> int | None:
    """How high a module of `scheduler` sits: cli 3, daemon 2, node 1, the core 0 (None
    outside `scheduler`; `python -m scheduler` is the command line's)."""
    if mod == "scheduler.__main__":
        return ROOMS["scheduler.cli"]
    for room, height in ROOMS.items():
        if within(mod, room):
            return height
    return 0 if within(mod, "scheduler") else None


def test_imports_between_process_rooms_only_go_down():
    """No sideways (or upward) import between process rooms: cli > daemon > node > core.

    `scheduler.node.emulation` imports the simulator's truth (`scheduler.simulate.truth`), a
    core module: the simulator is no process room. The site's configuration is a core type
    (`scheduler.site`); the cli imports `scheduler.daemon.policy_factory` to check `--policy`,
    downward (the cli sits above the daemon)."""
    assert is_core("scheduler.simulate.truth") and room_of("scheduler.simulate.truth") == 0
    upward = sorted(f"{mod} imports {imp}" for mod, imps in MODULES.items() if room_of(mod) is not None
                    for imp in imps if (room_of(imp) or 0) > room_of(mod))
    assert upward == []


def import_circles(modules: dict[str, set[str]] = MODULES) -> list[set[str]]:
    """The strongly connected parts (of more than one module) of the graph of imports between
    `modules` (module -> what it imports; those of scheduler, policies and telemetry), by
    Tarjan's algorithm."""
    graph = {m: sorted(i for i in imps if i in modules and i != m) for m, imps in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[set[str]] = []

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
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(part)

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    """Two modules that import each other (directly or round a longer loop, also inside a
    function or under TYPE_CHECKING) are one module in two files: move the shared piece down."""
    assert [sorted(c) for c in import_circles()] == []


def test_the_circle_finder_finds_circles_through_several_modules():
    modules = {"a": {"b", "x.y"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(sorted(c) for c in import_circles(modules)) == [["a", "b", "c"], ["d", "e"]]


MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 100
PARSER_CALLS = {"add_argument", "add_argument_group", "add_mutually_exclusive_group", "add_parser",
                "add_subparsers", "set_defaults"}

def is_parser_table(node: ast.AST) -> bool:
    """A function most of whose statements declare command-line options (argparse calls): a
    table, long by nature, exempt from the function limit."""
    statements = [s for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node]
    options = [s for s in statements if isinstance(s, (ast.Expr, ast.Assign)) and any(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in PARSER_CALLS
        for c in ast.walk(s))]
    return 2 * len(options) > len(statements)


def oversized(path: Path, name: str) -> dict[str, int]:
    """'module:qualified name' -> lines of each class over MAX_CLASS_LINES and each function
    over MAX_FUNCTION_LINES (parser option tables excepted) in one file."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                is_class = isinstance(child, ast.ClassDef)
                if lines > (MAX_CLASS_LINES if is_class else MAX_FUNCTION_LINES) and (
                        is_class or not is_parser_table(child)):
                    found[f"{name}:{prefix}{child.name}"] = lines
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), filename=str(path)), "")
    return found


SIZES = {key: lines for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
         for key, lines in oversized(p, module_name(p)).items()}


def test_no_class_over_400_lines_and_no_function_over_100():
    assert SIZES == {}


def test_the_size_rule_sees_classes_functions_and_parser_tables(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    options = "".join(f"    p.add_argument('--o{i}')\n" for i in range(MAX_FUNCTION_LINES))
    source = tmp_path / "m.py"
    source.write_text(f"class C:\n    def f(self):\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}\n"
                      f"def g():\n{body}\ndef build(p):\n{options}")
    assert set(oversized(source, "m")) == {"m:C.f", "m:g"}
