"""The README stands alone in a clone (issue 28): no pointer outside the repository, every
repository path its examples use exists, the design notes and the stable JSON keys ship in
docs/, and every key a job object has is documented there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readmes_point_at_nothing_outside_the_repository():
    for doc in ("README.md", "bench/README.md"):
        text = (ROOT / doc).read_text()
        assert "../shared/DESIGN.md" not in text, doc
        for line in text.splitlines():
            if line.startswith(("carbonsched ", "C=", "D=")) or " --jobs " in line:
                assert "../shared" not in line, (doc, line)


def test_every_repository_path_in_the_readme_examples_exists():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh)?\n(.*?)```", text, re.S)
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
