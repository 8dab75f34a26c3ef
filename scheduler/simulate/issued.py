"""Recorded forecasts with their issue times, for `simulate --forecast stored`.

A provider's forecast is a run of values for periods ahead, issued at one moment (WattTime
issues one every 5 minutes, Electricity Maps every hour). The store keeps every run with its
`issued_at`; trace files carry it in a column (WattTime's `generated_at`, Vessim's
`request_time`, a plain file's `issued_at`, an Electricity Maps forecast export's issue
column). Replaying them means: at planner time `now`, the newest run issued at or before
`now`, and nothing issued later.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from telemetry.grid.forecast import hourly_means


@dataclass
class IssuedForecasts:
    """Forecast runs of one zone, by issue time (epoch seconds): hourly values per run."""

    issued_s: list[float] = field(default_factory=list)
    runs: list[dict[int, float]] = field(default_factory=list)  # epoch hour -> gCO2/kWh

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[float, float, int, float]]) -> "IssuedForecasts":
        """From (issued_at_s, at_s, duration_s, value) rows; sub-hourly values are averaged."""
        by_issue: dict[float, list[tuple[float, int, float]]] = {}
        for issued_s, at_s, duration_s, value in rows:
            by_issue.setdefault(float(issued_s), []).append((float(at_s), int(duration_s), float(value)))
        out = cls()
        for issued_s in sorted(by_issue):
            out.issued_s.append(issued_s)
            out.runs.append(hourly_means(by_issue[issued_s]))
        return out

    def __len__(self) -> int:
        return len(self.issued_s)

    def latest(self, now_s: float) -> int | None:
        """Index of the newest run issued at or before `now_s`, or None if none was yet."""
        i = bisect.bisect_right(self.issued_s, now_s) - 1
        return i if i >= 0 else None
