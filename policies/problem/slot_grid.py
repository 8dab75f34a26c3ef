"""The planning problem's time axis: `n_slots` slots of `slot_s` seconds from `now`.

Slot 0 starts now. Starts fall on slot boundaries; a time is turned into a slot by rounding
up (`ceil`: the first slot that starts at or after it, never before slot 0) or down (`floor`:
the slot it falls in), each with a nanosecond-scale tolerance so a time on a boundary
counts as that boundary.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np


class SlotGrid:
    """`n_slots` slots of `slot_s` seconds from `now`; `offsets_s[s]` is slot s's start in
    seconds from now, `index` the slots' numbers (both read-only arrays, shared)."""

    def __init__(self, now: datetime, slot_s: float, n_slots: int) -> None:
        self.now = now
        self.slot_s = slot_s
        self.n_slots = n_slots
        self.offsets_s = np.arange(n_slots, dtype=np.float64) * slot_s
        self.index = np.arange(n_slots, dtype=np.int64)

    def ceil(self, t: datetime) -> int:
        """The first slot starting at or after `t` (0 for a time in the past)."""
        return max(0, int(math.ceil((t - self.now).total_seconds() / self.slot_s - 1e-9)))

    def floor(self, t: datetime) -> int:
        """The slot `t` falls in (negative before now)."""
        return int(math.floor((t - self.now).total_seconds() / self.slot_s + 1e-9))

    def time(self, slot: int) -> datetime:
        """When slot `slot` starts."""
        return self.now + timedelta(seconds=slot * self.slot_s)
