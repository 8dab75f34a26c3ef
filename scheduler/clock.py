"""The wall clock every part of carbonsched reads: timezone-aware UTC.

A module of its own, below the store and the job lifecycle, so anything that stamps a time
(the store's identity, the lifecycle's events, the planner, the agent) imports it without
importing the job-state module, and tests hand any of them another clock.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    """Now, timezone-aware UTC (what the store takes and gives back)."""
    return datetime.now(timezone.utc)
