"""Durations like `90m`, `6h`, `1h30m` and times as durations from now or ISO 8601."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `45s`, `90m`, `6h`, `1h30m`, `2d` or a bare `120` (s).

    ValueError for anything else, negative values included.
    """
    t = str(text).strip().lower()
    if not t:
        raise ValueError("empty duration")
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    pos, total = 0, 0.0
    for m in _PART.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(t) or pos == 0:
        raise ValueError(f"malformed duration {text!r}; use e.g. 45s, 90m, 6h, 1h30m, 2d")
    return total


def parse_time(text: str, now: datetime) -> datetime:
    """A moment given as a duration from `now` (`6h`) or an ISO 8601 time (local if no zone).
    ValueError for text that is neither, or a moment outside years 1-9999 in UTC (e.g.
    `9999-12-31T23:59:59-23:59`, `999999999d`), so no caller sees an OverflowError."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        pass
    else:
        try:
            return (now + timedelta(seconds=seconds)).astimezone(timezone.utc)
        except OverflowError:
            raise ValueError(f"time {text!r} is out of range (years 1-9999)") from None
    try:
        t = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise ValueError(
            f"malformed time {text!r}; use a duration from now (6h) or ISO 8601 (2026-12-01T02:00Z)"
        ) from None
    try:
        if t.tzinfo is None:
            t = t.astimezone()  # interpret as the caller's local time
        return t.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"time {text!r} is out of range (years 1-9999)") from None


def parse_past(text: str, now: datetime) -> datetime:
    """A moment in the past, as sacct's -S takes it: a duration back from `now` (`7d`) or an
    ISO 8601 time (local if no zone). ValueError as `parse_time`."""
    try:
        return now - timedelta(seconds=parse_duration(text))
    except ValueError:
        return parse_time(text, now)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    h, rem = divmod(s, 3600)
    return f"{h}h{rem // 60:02d}m" if rem else f"{h}h"


def utc_aware(t: datetime, name: str) -> datetime:
    """`t` in UTC; ValueError naming `name` if it is naive (a naive time has no instant)."""
    if t.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {t!r}")
    return t.astimezone(timezone.utc)


def iso(t: datetime | None) -> str | None:
    """ISO 8601 UTC with a Z, or None."""
    if t is None:
        return None
    return t.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


_SLURM_TIME = re.compile(r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                         r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)")


def parse_slurm_time(text: str) -> float:
    """Seconds in a time limit written as Slurm's `--time` takes it: `90` (minutes), `MM:SS`,
    `HH:MM:SS`, `D-HH`, `D-HH:MM` or `D-HH:MM:SS`. ValueError for anything else, and for a
    limit of zero (Slurm's `0` means "no limit"; here every job has one).

    Minutes, seconds past the first field, and hours after a day count are at most 59 (23
    for those hours), as Slurm reads them: `90:00` is 90 minutes, `1-25` is refused."""
    t = str(text).strip()
    m = _SLURM_TIME.fullmatch(t)
    if m is None:
        raise ValueError(f"malformed time {text!r}; use minutes (90), MM:SS, HH:MM:SS, D-HH, D-HH:MM "
                         "or D-HH:MM:SS")
    if m.group("days") is not None:
        days, hours = int(m.group("days")), int(m.group("dh"))
        minutes, seconds = int(m.group("dm") or 0), int(m.group("ds") or 0)
        if hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError(f"time {text!r}: hours after the day count are 0-23, minutes and seconds 0-59")
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    else:
        parts = [int(p) for p in (m.group("a"), m.group("b"), m.group("c")) if p is not None]
        if any(p > 59 for p in parts[1:]):
            raise ValueError(f"time {text!r}: minutes and seconds after the first field are 0-59")
        if len(parts) == 1:  # minutes
            total = parts[0] * 60
        elif len(parts) == 2:  # MM:SS
            total = parts[0] * 60 + parts[1]
        else:  # HH:MM:SS
            total = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    if total <= 0:
        raise ValueError(f"time {text!r} is zero: give a positive limit (0 is not \"unlimited\" here)")
    return float(total)
