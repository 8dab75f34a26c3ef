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

ROOT = Path(__file__).resolve().parent.parent
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
            "scheduler.node.agent", "scheduler.store.engine", "policies.cpsat", "telemetry.gpu.nvml"} <= set(MODULES)
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
