"""Plain-text tables with aligned columns, for the CLI and the simulator's report."""

from __future__ import annotations

import math
import re

# What must never reach a terminal raw from stored text (job names, commands, directories,
# reasons): C0 and C1 controls (escape sequences, newlines that forge a line such as
# "owner: alice", carriage returns), DEL, line/paragraph separators, bidi overrides.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: str) -> str:
    """`text` with every terminal control shown as an escape (`\\x1b`, `\\n`, `\\u202e`)."""
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """`headers` and `rows` as left-aligned columns two spaces apart, without trailing blanks;
    cells shown with `printable`."""
    rows = [[printable(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def significant(v: float, digits: int = 3) -> str:
    """`v` to `digits` significant digits, never in exponent notation (0.0000482, not
    4.82e-05; 1510, not 1.51e+03). The CLI's twin of `policies.types.sig`: a command starts
    on the standard library alone, so it cannot import `policies` (tests/project/test_layout.py),
    and `policies` may not import `scheduler`; tests/cli/test_report_cli.py holds them equal."""
    text = format(v, f".{digits}g")
    if "e" not in text or not math.isfinite(v) or v == 0:
        return text
    decimals = digits - 1 - math.floor(math.log10(abs(v)))
    return f"{v:.{decimals}f}" if decimals >= 0 else f"{round(v, decimals):.0f}"


def small_grams(g: float) -> str:
    """A gram figure under a few grams with three significant digits, in µg under a
    milligram (a prompt's share of a small job: "0.623 µg", not "0.000000623 g")."""
    if g != 0 and abs(g) < 0.001:
        return f"{significant(g * 1e6)} µg"
    return f"{significant(g)} g"
