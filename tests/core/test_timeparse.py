"""scheduler.timeparse: durations (`45s`, `90m`, `1h30m`, bare seconds) and points in time.

These are the strings users type after --est-runtime, --time-limit, --deadline and
--plan-interval, so a typo must be a clear ValueError, never a silently wrong number.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from scheduler.timeparse import format_duration, iso, parse_duration, parse_slurm_time, parse_time

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


# -- parse_duration: what is accepted -------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45),
        ("90m", 90 * 60),
        ("6h", 6 * 3600),
        ("1h30m", 5400),
        ("2d", 2 * 86400),
        ("1w", 7 * 86400),
        ("250ms", 0.25),
        ("1d2h3m4s", 86400 + 7200 + 180 + 4),
        ("1.5h", 5400),
        ("120", 120),
        ("0.5", 0.5),
        ("0", 0),
        ("90M", 5400),  # units are case-insensitive
        ("  6h  ", 6 * 3600),  # surrounding blanks are ignored
    ],
)
def test_parse_duration_accepts_unit_suffixed_and_bare_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_duration_returns_float_seconds():
    assert isinstance(parse_duration("90m"), float)
    assert isinstance(parse_duration("120"), float)


def test_ms_suffix_is_milliseconds_not_minutes_plus_seconds():
    """`5ms` is 5 milliseconds; the `m` must not be read as minutes."""
    assert parse_duration("5ms") == pytest.approx(0.005)
    assert parse_duration("5m5s") == pytest.approx(305)


# -- parse_duration: what is rejected -------------------------------------------------------

@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "abc",
        "h",
        "6x",  # unknown unit
        "6 hours",  # words are not units
        "1h 30m",  # blanks inside a duration
        "1h30",  # trailing number without a unit
        "h30m",  # unit without a number
        "1e3",  # no exponents
        ".5h",  # a number must start with a digit
        "1,5h",  # decimal comma
        "5s!",
        "PT5M",  # ISO 8601 durations are not supported
        "1h-30m",
        "None",
    ],
)
def test_parse_duration_rejects_malformed_text(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-5", "-5m", "-1h30m", "+5m", "-0.5"])
def test_parse_duration_rejects_negative_and_signed_values(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_malformed_duration_error_names_the_input_and_shows_examples():
    with pytest.raises(ValueError) as err:
        parse_duration("6 hours")
    message = str(err.value)
    assert "'6 hours'" in message
    assert "90m" in message and "1h30m" in message


# -- parse_time -----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "delta"), [("6h", timedelta(hours=6)),
                                             ("90m", timedelta(minutes=90)),
                                             ("1h30m", timedelta(minutes=90)),
                                             ("3600", timedelta(hours=1))])
def test_parse_time_reads_a_duration_as_that_long_from_now(text, delta):
    assert parse_time(text, NOW) == NOW + delta


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-02T02:00:00Z", datetime(2026, 12, 2, 2, 0, tzinfo=timezone.utc)),
        ("2026-12-02T02:00Z", datetime(2026, 12, 2, 2, 0, tzinfo=timezone.utc)),
        ("2026-12-02T02:00:00+00:00", datetime(2026, 12, 2, 2, 0, tzinfo=timezone.utc)),
        ("2026-12-02T03:00:00+01:00", datetime(2026, 12, 2, 2, 0, tzinfo=timezone.utc)),
        ("2026-12-01T21:00:00-05:00", datetime(2026, 12, 2, 2, 0, tzinfo=timezone.utc)),
    ],
)
def test_parse_time_reads_iso_8601_with_a_zone_and_returns_utc(text, expected):
    t = parse_time(text, NOW)
    assert t == expected
    assert t.utcoffset() == timedelta(0)


@pytest.fixture
def new_york_local_time(monkeypatch):
    """Run with the process's local time zone set to America/New_York (UTC-5 in December)."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_parse_time_reads_iso_without_a_zone_as_the_callers_local_time(new_york_local_time):
    t = parse_time("2026-12-02T02:00:00", NOW)
    assert t == datetime(2026, 12, 2, 7, 0, tzinfo=timezone.utc)
    assert t.utcoffset() == timedelta(0)


@pytest.mark.parametrize("text", ["tomorrow", "2026-13-01T00:00Z", "02:00 next day", "-6h", ""])
def test_parse_time_rejects_text_that_is_neither_a_duration_nor_iso(text):
    with pytest.raises(ValueError) as err:
        parse_time(text, NOW)
    assert "6h" in str(err.value) and "ISO 8601" in str(err.value)


# -- formatting -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (45, "45s"), (60, "1m"), (90, "1m30s"), (3600, "1h"),
     (5400, "1h30m"), (90000, "25h")],
)
def test_format_duration_is_short_and_human(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [45, 60, 3600, 5400])
def test_formatted_durations_parse_back_to_the_same_value(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


def test_iso_writes_utc_with_a_z_and_none_for_none():
    t = datetime(2026, 12, 2, 3, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert iso(t) == "2026-12-02T02:00:00Z"
    assert iso(None) is None


# -- Slurm's --time formats ----------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("90", 90 * 60),                 # a bare number is minutes, as sbatch --time=90
    ("1", 60),
    ("05:30", 5 * 60 + 30),          # MM:SS
    ("90:00", 90 * 60),              # minutes may exceed 59 in the first field
    ("01:30:00", 90 * 60),           # HH:MM:SS
    ("48:00:00", 48 * 3600),
    ("2-12", (2 * 24 + 12) * 3600),  # D-HH
    ("1-02:30", (26 * 60 + 30) * 60),  # D-HH:MM
    ("0-00:00:05", 5),               # D-HH:MM:SS
    (" 3-04:05:06 ", ((3 * 24 + 4) * 60 + 5) * 60 + 6),
])
def test_slurm_time_formats_are_read_as_sbatch_reads_them(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1h", "90m", "-5", "1:2:3:4", "1-", "1-2:3:4:5", "00:61",
                                  "1:60:00", "1-24", "1-02:60", "0", "00:00", "0-0", "1.5"])
def test_other_times_and_a_zero_limit_are_refused_with_the_formats_named(text):
    with pytest.raises(ValueError, match="time"):
        parse_slurm_time(text)
