"""The README and the documentation site stand alone in a clone (issue 28): no pointer outside
the repository, every repository path their examples use exists, the design notes and the
stable JSON keys ship in docs/, and every key a job object has is documented there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cli_process import all_parsers

ROOT = Path(__file__).resolve().parents[2]


def _docs() -> list[Path]:
    """What a user reads: the READMEs and every page of the documentation site."""
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_readmes_and_docs_point_at_nothing_outside_the_repository():
    for path in _docs():
        doc = str(path.relative_to(ROOT))
        text = path.read_text()
        assert "../shared/DESIGN.md" not in text, doc
        for line in text.splitlines():
            if line.startswith(("carbonsched ", "C=", "D=")) or " --jobs " in line:
                assert "../shared" not in line, (doc, line)


def test_every_repository_path_in_the_readme_and_docs_examples_exists():
    blocks = [b for p in _docs() for b in re.findall(r"```(?:sh|text)?\n(.*?)```", p.read_text(), re.S)]
    paths = set()
    for block in blocks:
        paths |= set(re.findall(r"(?<![\w/$])((?:tests|scheduler|examples|systemd|docs|scripts)/[\w./-]+\.\w+)", block))
    assert "tests/data/carbon/GB_2022-01-01_to_2022-01-14_hourly.csv" in paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []
    sim = next(b for b in blocks if "--jobs $D/pai_demo.csv" in b)
    d = re.search(r"^D=(\S+)", sim, re.M).group(1)
    for name in re.findall(r"\$D/([\w.-]+)", sim):
        assert (ROOT / d / name).exists(), name


def test_the_design_notes_and_json_keys_ship_in_docs_and_cover_every_job_key():
    design = (ROOT / "docs" / "design.md").read_text()
    keys_doc = (ROOT / "docs" / "json-keys.md").read_text()
    assert "## CLI contract" in design and "json-keys.md" in design
    src = (ROOT / "scheduler" / "job_view.py").read_text()
    body = src[src.index("out.append({"):src.index("    return out")]
    keys = set(re.findall(r'"([a-z_0-9]+)":', body)) - {"max_batch", "precision", "tp"}
    undocumented = sorted(k for k in keys if f"`{k}`" not in keys_doc)
    assert undocumented == []


# ---- no internal issue numbers in what a user reads ----------------------------------------
# Issue numbers mean something only to the project's own trackers; a user reading "(issue 30)"
# after a flag cannot know what it is. Code comments, private docstrings and tests may keep them.

ISSUE_NUMBER = re.compile(r"\bissues?[\s-]#?\d+", re.I)
LOG_CALLS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
USER_TEXT_KEYWORDS = {"help", "description", "epilog"}
PRODUCT = ("scheduler", "policies", "telemetry")
SCRIPTS = ("bench", "scripts", "policies/data")


def _issue_numbers(text: str) -> list[str]:
    return [m.group(0) for m in ISSUE_NUMBER.finditer(text)]


def _strings_in(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _user_text_of(tree: ast.Module) -> list[tuple[int, str]]:
    """String literals a user reads: log lines, raised errors, CliError and argparse help/description
    texts (a description taken from the module docstring as it is cut there)."""
    doc = ast.get_docstring(tree, clean=False) or ""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found += [(c.lineno, c.value) for c in _strings_in(node.exc)]
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if (name in LOG_CALLS and isinstance(node.func, ast.Attribute)) or name.endswith("Error") \
                or name in {"exit", "print"}:
            found += [(c.lineno, c.value) for arg in node.args for c in _strings_in(arg)]
        for kw in node.keywords:
            if kw.arg not in USER_TEXT_KEYWORDS:
                continue
            if any(isinstance(n, ast.Name) and n.id == "__doc__" for n in ast.walk(kw.value)):
                shown = eval(compile(ast.Expression(kw.value), "<description>", "eval"),  # noqa: S307
                             {"__builtins__": {}, "__doc__": doc})
                found.append((kw.value.lineno, str(shown)))
            else:
                found += [(c.lineno, c.value) for c in _strings_in(kw.value)]
    return found


def test_the_readmes_and_docs_name_no_issue_numbers():
    hits = [(str(p.relative_to(ROOT)), n, line.strip()) for p in _docs()
            for n, line in enumerate(p.read_text().splitlines(), 1) if ISSUE_NUMBER.search(line)]
    assert hits == []


def test_no_verb_help_and_no_setting_names_an_issue_number():
    from scheduler import settings

    parsers = list(all_parsers())
    assert {"carbonsched submit", "carbonsched simulate", "carbonsched config show"} <= {p.prog for p in parsers}
    hits = [(p.prog, _issue_numbers(p.format_help())) for p in parsers if _issue_numbers(p.format_help())]
    hits += [(s.key, _issue_numbers(s.help)) for s in settings.SETTINGS if _issue_numbers(s.help)]
    assert hits == []


def test_no_log_line_error_or_script_help_names_an_issue_number():
    files = [p for d in PRODUCT + SCRIPTS for p in sorted((ROOT / d).rglob("*.py"))]
    files.append(ROOT / "scripts" / "gpu-check")
    hits = []
    for path in files:
        for line, text in _user_text_of(ast.parse(path.read_text())):
            if ISSUE_NUMBER.search(text):
                hits.append(f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}")
    assert hits == []


def test_the_issue_number_check_finds_what_it_should():
    tree = ast.parse('"""Tool (issue 12).\n\nMore."""\nimport logging, argparse\nlog = logging.getLogger(__name__)\n'
                     'log.warning("late (issue 30)")\nraise CliError(f"bad {x}, see issues 18, 27")\n'
                     'argparse.ArgumentParser(description=__doc__.splitlines()[0]).add_argument("--x", help="ok")\n'
                     'def f():\n    """Private, may say issue 9."""\n    # issue 7 in a comment\n')
    hits = {text for _, text in _user_text_of(tree) if ISSUE_NUMBER.search(text)}
    assert hits == {"late (issue 30)", ", see issues 18, 27", "Tool (issue 12)."}
    assert _issue_numbers("the issue-27 branch; Issue #5; issues every 3 h") == ["issue-27", "Issue #5"]
