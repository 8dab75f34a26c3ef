"""The `carbonsched` command line as a real subprocess, for the tests that need no daemon: a
caller's environment without CARBONSCHED_* settings, one run, and the one-line error check."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def clean_env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without any CARBONSCHED_* settings, state under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARBONSCHED_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), COLUMNS="80", PYTHONPATH=str(ROOT))
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`carbonsched ARGS` (as `python -m scheduler`) from the repository, within 60 s."""
    return subprocess.run([sys.executable, "-m", "scheduler", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """Assert stderr is exactly one `carbonsched: ...` line with no traceback; return it."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("carbonsched: "), lines[0]
    return lines[0]


def all_parsers(parser: argparse.ArgumentParser | None = None):
    """The CLI's parser and every verb's and sub-verb's below it, depth first (`prog` names
    each: "carbonsched config show"); the whole CLI when no parser is given."""
    if parser is None:
        from scheduler.cli.main import build_parser

        parser = build_parser()
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from all_parsers(sub)
