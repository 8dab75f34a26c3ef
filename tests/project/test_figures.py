"""bench/figures.py (issue 47): the expected table parses, names the same figures and commands
as the code, and the comparison flags a value outside its tolerance. Runs nothing and needs
no ../shared."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.figures import EXPECTED, Expected, figures, judge, load_expected, main  # noqa: E402


def test_the_expected_table_parses_and_matches_the_figures_and_their_commands():
    expected = load_expected()
    defs = {f.name: f for f in figures()}
    assert set(expected) == set(defs)
    for name, e in expected.items():
        assert e.command == defs[name].command, name
        assert e.measured and e.source and e.unit, name
        assert e.tolerance >= 0 and math.isfinite(e.expected), name
    assert any(e.alone and e.check == "max" for e in expected.values())  # the timings


def test_a_band_flags_values_outside_expected_plus_or_minus_the_tolerance():
    e = Expected(expected=13.13, tolerance=0.05)
    assert judge(13.13, 0, e) == (True, "")
    assert judge(13.17, None, e)[0]
    ok, why = judge(10.00, 0, e)
    assert not ok and "below 13.08" in why
    assert not judge(13.19, 0, e)[0]  # better than expected is a change too: update the table
    assert not judge(None, 0, e)[0] and not judge(math.nan, 0, e)[0]


def test_one_sided_checks_and_deadline_misses():
    ceiling = Expected(expected=1.0, tolerance=4.0, check="max")
    assert judge(0.1, None, ceiling)[0] and judge(5.0, None, ceiling)[0]
    assert not judge(5.1, None, ceiling)[0]
    floor = Expected(expected=12.6, tolerance=0.0, check="min")
    assert judge(99.0, None, floor)[0] and not judge(12.5, None, floor)[0]
    strict = Expected(expected=15.0, tolerance=0.1, max_deadline_misses=0)
    ok, why = judge(15.0, 2, strict)
    assert not ok and "2 deadline misses" in why


def test_a_bad_table_is_refused(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text('[figure."x"]\nexpected = 1.0\ntolerance = 0.1\ncheck = "about"\n')
    with pytest.raises(ValueError, match="check"):
        load_expected(bad)
    bad.write_text('[figure."x"]\nexpected = 1.0\ntolerance = 0.1\ntolerence = 2\n')
    with pytest.raises(ValueError, match="unknown keys"):
        load_expected(bad)


def test_missing_shared_data_exits_2_and_a_table_that_disagrees_exits_1(tmp_path, monkeypatch, capsys):
    import bench.figures as F

    monkeypatch.setattr(F, "DATA", tmp_path / "nowhere")
    assert main(["--only", "gap.greedy_vs_fifo"]) == 2
    assert "no shared data" in capsys.readouterr().err
    table = tmp_path / "t.toml"
    table.write_text(EXPECTED.read_text().replace('[figure."gap.greedy_vs_fifo"]', '[figure."gap.renamed"]'))
    assert main(["--expected", str(table)]) == 1
    assert "disagree" in capsys.readouterr().err
