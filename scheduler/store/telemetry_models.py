"""Tables for GPU power telemetry: raw samples for a retention window, minute rollups after.

Sample times are Unix seconds as floats: compact, fast to bucket into minutes with plain
arithmetic on every database, and exactly what the sampler produces.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Index, Integer
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.store.models import Base


class GpuSample(Base):
    __tablename__ = "gpu_samples"
    __table_args__ = (Index("ix_gpu_samples_t_s", "t_s"),)

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
