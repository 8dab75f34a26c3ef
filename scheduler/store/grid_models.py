"""SQLAlchemy table of the grid operators' day-ahead wind and solar forecasts
(see scheduler/grid_forecasts.py).

- `grid_day_ahead`: one row per (zone, production type, UTC hour, issue time): the hour's
  mean generation forecast in MW of `solar`, of `wind` (onshore + offshore in one value) or
  of `wind_onshore` / `wind_offshore`; whether the file's source filled it in (`imputed`),
  where it came from, and when it was imported. `issued_at` is when the forecast was
  published (for imported files: 18:00 local time of the day before), so an as-of read never
  sees a value before it was known.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.store.base import Base, UTCDateTime


class GridDayAhead(Base):
    __tablename__ = "grid_day_ahead"
    # The primary key's order (zone, at, ...) is the read's index: one zone, a range of hours,
    # each hour's newest issue per production type at or before the as-of time.

    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    production_type: Mapped[str] = mapped_column(String(16), primary_key=True)
    issued_at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    mw: Mapped[float] = mapped_column(Float)
    imputed: Mapped[bool] = mapped_column(Boolean)
    source: Mapped[str] = mapped_column(String(64))
    imported_at: Mapped[datetime] = mapped_column(UTCDateTime)


grid_day_ahead = GridDayAhead.__table__
