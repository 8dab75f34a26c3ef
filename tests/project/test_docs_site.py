"""The documentation site (mkdocs.yml, docs/) and the short README: the README stays a tour
of at most 250 lines whose links all land; every page is in the site's navigation and every
navigation entry is a page; the generated reference pages (CLI, configuration keys, hardware
catalog, guarded figures) are what scripts/cli_reference.py gives today, so they never drift
from the parser, the settings table, the catalog or figures_expected.toml; every Prometheus
metric the code serves is on the metrics page. `mkdocs build --strict` itself runs in
.ci/run (a broken link or anchor inside the site fails there)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from cli_process import all_parsers

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages() -> list[str]:
    """The .md paths named in mkdocs.yml's nav (read as text: the file is plain YAML)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r":\s+([\w./-]+\.md)\s*$", nav, re.M)


def _anchors(markdown: str) -> set[str]:
    """The heading ids MkDocs' toc gives a page (its default slugify)."""
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, re.M):
        text = re.sub(r"[`*]", "", heading).lower()
        text = re.sub(r"[^\w\s-]", "", text)
        out.add(re.sub(r"[-\s]+", "-", text).strip("-"))
    return out


def test_the_readme_is_a_short_tour_of_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    text = "\n".join(lines)
    for section in ("## Quick start", "## A short tour", "docs/getting-started.md", "docs/reference/cli.md"):
        assert section in text


def test_every_link_of_the_readme_and_bench_readme_lands_on_a_file_and_heading():
    for doc in (ROOT / "README.md", ROOT / "bench" / "README.md"):
        for target in LINK.findall(doc.read_text()):
            if target.startswith(("http://", "https://", "#")):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve()
            assert file.exists(), (doc.name, target)
            if anchor:
                assert anchor in _anchors(file.read_text()), (doc.name, target)


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page():
    nav = _nav_pages()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav))
    assert "json-keys.md" in nav and "design.md" in nav and "reference/cli.md" in nav


def test_the_generated_reference_pages_are_what_the_code_gives_today():
    ref = _cli_reference()
    stale = [str(path.relative_to(ROOT)) for path, text in ref.pages().items()
             if not path.exists() or path.read_text() != text]
    assert stale == [], f"regenerate with: .venv/bin/python scripts/cli_reference.py ({stale})"


def test_the_cli_reference_names_every_verb_and_option_of_the_parser():
    page = (DOCS / "reference" / "cli.md").read_text()
    missing = []
    for parser in all_parsers():
        if f"`{parser.prog}`" not in page:
            missing.append(parser.prog)
        for action in parser._actions:
            missing += [f"{parser.prog} {o}" for o in action.option_strings if o not in ("-h", "--help") and o not in page]
    assert missing == []


def test_every_served_prometheus_metric_is_on_the_metrics_page():
    src = (ROOT / "scheduler" / "metrics.py").read_text()
    page = (DOCS / "reference" / "metrics.md").read_text()
    defined = re.findall(r'(Counter|Gauge|Histogram|CounterMetricFamily|GaugeMetricFamily)\(\s*"(carbonsched_\w+)"',
                         src)
    assert len(defined) >= 20
    names = {name + "_total" if kind.startswith("Counter") and not name.endswith("_total") else name
             for kind, name in defined}
    assert sorted(n for n in names if f"| {n} |" not in page) == []


def test_the_benchmark_page_keeps_one_current_figure_set_and_bench_readme_points_at_it():
    page = (DOCS / "benchmarks.md").read_text()
    for bench in ("api_bench.py", "two_user_audit.py", "forecast_eval.py", "bench.planner", "simulate_bench.py",
                  "long_jobs_bench.py", "report_bench.py", "bench.model", "convergence_bench.py", "slurm_bench.py"):
        assert bench in page, bench
    assert not re.search(r"\bsession \d+\b|\b(fifth|twelfth|thirteenth|fifteenth) session\b", page, re.I)
    index = (ROOT / "bench" / "README.md").read_text()
    assert "../docs/benchmarks.md" in index and len(index.splitlines()) <= 60


def test_every_simulate_example_that_runs_cpsat_caps_its_search_and_says_how_long_it_takes():
    """A reader who copies a `simulate` example with cpsat gets minutes, not the 18 minutes of
    cpsat's default search per plan, and is told what to expect before running it."""
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = page.read_text()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            command = block.replace("\\\n", " ")
            for line in command.splitlines():
                if "carbonsched simulate" in line and re.search(r"--policy \S*cpsat(?!:\S*max_time_s)", line):
                    raise AssertionError(f"{page.relative_to(ROOT)}: {line.strip()[:120]}")
    assert "takes about 3 minutes" in (DOCS / "simulating.md").read_text()
