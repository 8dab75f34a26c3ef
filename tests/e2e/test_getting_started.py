"""The documentation's first hour runs as written: every `sh` block of the getting-started
page (docs/getting-started.md), in order, in one shell from the checkout, and the README's
quick start, `make demo` (scripts/demo.py), end to end. A page that drifts from the code
(a renamed flag, a verb that fails, a job that never ends) fails here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_process import ROOT, clean_env

pytestmark = pytest.mark.slow

TUTORIAL = ROOT / "docs" / "getting-started.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def tutorial_script(text: str) -> str:
    """The page's `sh` blocks as one script that stops at the first failing command."""
    blocks = SH_BLOCK.findall(text)
    return "set -euo pipefail\n" + "\n".join(blocks)


def _stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """End whatever the script left in its process group (the daemon it started with `&`),
    waiting until the group is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_the_tutorial_page_has_the_steps_a_newcomer_takes():
    script = tutorial_script(TUTORIAL.read_text())
    for step in ("carbonsched daemon --emulate", "carbonsched submit", "--array", "--dependency afterok:",
                 "carbonsched logs --follow", "carbonsched show 8", "carbonsched report", "carbonsched carbon import",
                 "carbonsched simulate", "kill %1"):
        assert step in script, step
    assert "make demo" not in script  # the demo is its own test below, not run twice


def test_every_command_of_the_getting_started_page_runs_as_written(tmp_path):
    env = clean_env(tmp_path)
    env["TMPDIR"] = str(tmp_path)  # the page's `mktemp -d` lands here
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # any install's carbonsched
    proc = subprocess.Popen(["bash", "-c", tutorial_script(TUTORIAL.read_text())], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        _stop_group(proc)
    state_dirs = [p for p in tmp_path.iterdir() if p.name.startswith("tmp.")]
    log = (state_dirs[0] / "daemon.log").read_text()[-4000:] if state_dirs else "no state dir"
    assert proc.returncode == 0, f"{out[-6000:]}\n--- daemon log ---\n{log}"
    # what the page tells the reader they will see
    assert "submitted job 8" in out
    assert "carbon receipt:" in out and "per prompt:" in out and "prompts, reported)" in out
    assert "DRAINED" in out and "fan noise" in out
    assert "task 0" in out  # logs --follow 3


def test_the_readme_quick_start_is_make_demo_and_make_test_and_the_demo_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):]
    block = SH_BLOCK.search(quick).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    demo_recipe = re.search(r"^demo:.*\n\t(.*)$", makefile, re.M).group(1)
    test_recipe = re.search(r"^test:.*\n\t(.*)$", makefile, re.M).group(1)
    assert demo_recipe == "$(BIN)/python scripts/demo.py"
    assert "-m pytest" in test_recipe  # `make test` is this suite itself: not run from inside it

    # `make demo`'s recipe, with the interpreter running these tests
    proc = subprocess.run([sys.executable, "scripts/demo.py"], cwd=ROOT, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "carbon receipt:" in proc.stdout and "demo done." in proc.stdout
