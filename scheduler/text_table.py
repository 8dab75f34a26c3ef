"""Plain-text tables with aligned columns, for the CLI and the simulator's report."""

from __future__ import annotations


def table(headers: list[str], rows: list[list[str]]) -> str:
    """`headers` and `rows` as left-aligned columns two spaces apart, without trailing blanks."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)

