"""Tables for GPU power telemetry: raw samples for a retention window, minute rollups after.

Sample times are Unix seconds as floats, exactly what the sampler produces. Raw samples are
clustered by (minute, GPU, time): rolling up old minutes then reads and deletes one
contiguous key range (on SQLite the table is WITHOUT ROWID, so there is one b-tree and no
secondary index to maintain), which keeps a day's rollup of 64 GPUs within seconds.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.store.base import Base


class GpuSample(Base):
    __tablename__ = "gpu_samples"
    __table_args__ = {"sqlite_with_rowid": False}

    minute_s: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    gpu_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    t_s: Mapped[float] = mapped_column(Float, primary_key=True)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    utilization_pct: Mapped[float | None] = mapped_column(Float, nullable=True)


class GpuPowerMinute(Base):
    """One GPU over one minute: min/mean/max power and the energy integrated over it."""

    __tablename__ = "gpu_power_minutes"

    gpu_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    minute_s: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    samples: Mapped[int] = mapped_column(Integer)
    min_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)


gpu_samples = GpuSample.__table__
gpu_power_minutes = GpuPowerMinute.__table__
