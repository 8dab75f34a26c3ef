"""SQLAlchemy tables of the carbon-signal store (see scheduler/carbon.py).

- `carbon_intensity`: one value per (zone, signal, kind, source, period start, issue time).
  Actuals carry the time they became known as `issued_at` (the end of their period for
  imported traces), forecasts the time they were issued, so "as of t" queries are exact.
- `carbon_fetches`: the live-provider call log per (provider, zone, endpoint): when it was
  last called and may next be called. It is the shared cache gate that keeps every process
  (daemon, agents, CLI) within the providers' call limits.
- `carbon_zone_status`: the fallback level a zone's forecasts currently come from (live,
  own, static, none) and why, written on each change, shown by `carbonsched carbon show`.
- `carbon_zone_versions`: a counter per zone bumped in the same transaction as every write
  of its carbon data (an import, a provider refresh), so a planner in another process sees
  in one small query per tick that the curves it holds are stale.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.store.base import Base, UTCDateTime


class CarbonIntensity(Base):
    __tablename__ = "carbon_intensity"
    # The primary key's order (zone, signal, kind, at, ...) is the series index: intensity()
    # and forecast() read one series by a range of `at`. The second index finds the newest
    # forecast issue.
    __table_args__ = (
        Index("ix_carbon_intensity_issue", "zone", "signal", "kind", "issued_at"),
    )

    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    signal: Mapped[str] = mapped_column(String(16), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    issued_at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    source: Mapped[str] = mapped_column(String(64), primary_key=True)
    duration_s: Mapped[int] = mapped_column(Integer)
    gco2_per_kwh: Mapped[float] = mapped_column(Float)
    estimated: Mapped[bool | None] = mapped_column(Boolean, nullable=True)


class CarbonFetch(Base):
    __tablename__ = "carbon_fetches"

    provider: Mapped[str] = mapped_column(String(32), primary_key=True)
    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_success_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    next_allowed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    calls: Mapped[int] = mapped_column(Integer, default=0)
    rows: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class CarbonZoneStatus(Base):
    __tablename__ = "carbon_zone_status"

    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    level: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    since: Mapped[datetime] = mapped_column(UTCDateTime)


class CarbonZoneVersion(Base):
    __tablename__ = "carbon_zone_versions"

    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


carbon_intensity = CarbonIntensity.__table__
carbon_fetches = CarbonFetch.__table__
carbon_zone_status = CarbonZoneStatus.__table__
carbon_zone_versions = CarbonZoneVersion.__table__
