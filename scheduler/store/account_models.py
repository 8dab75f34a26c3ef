"""SQLAlchemy tables of accounts and their users (`scheduler.accounts` reads and writes them).

- `accounts`: an operator-managed tree of accounts, each with its fair-share `shares`
  (Slurm's `sacctmgr add account`): `research`, `research/nlp` under it. The built-in
  `default` account always exists (the migration makes it), so a one-user install needs no
  set-up: a job of a user without associations is charged to it.
- `account_users`: which user (by name, as `owner_name` of a job) may charge which account,
  and which of a user's accounts is their default (at most one per user, kept so by
  `scheduler.accounts`; a job submitted without `--account` goes there).
- `account_limits`: an account's budget in one currency (`gpu_hours`, `kwh` or `kgco2e`) per
  period (`month`, `quarter` or a date range `2026-11-01..2026-12-31`), as
  `scheduler.budgets` parses, checks and enforces it (Slurm's `GrpTRESMins`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column

from scheduler.store.base import Base, UTCDateTime

#: The account every install has, and every job without one is charged to.
DEFAULT_ACCOUNT = "default"


class Account(Base):
    __tablename__ = "accounts"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    # NULL: a top-level account. An account with children or with jobs waiting or running
    # cannot be deleted (`scheduler.accounts.delete_account`), so RESTRICT only guards.
    parent: Mapped[str | None] = mapped_column(ForeignKey("accounts.name", ondelete="RESTRICT"),
                                               nullable=True, index=True)
    shares: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AccountUser(Base):
    """One association: `user_name` may charge `account`; `is_default`: jobs of that user
    without `--account` go there."""

    __tablename__ = "account_users"
    __table_args__ = (UniqueConstraint("user_name", "account", name="uq_account_users_user_name_account"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_name: Mapped[str] = mapped_column(String(255), index=True)
    account: Mapped[str] = mapped_column(ForeignKey("accounts.name", ondelete="CASCADE"), index=True)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AccountLimit(Base):
    """One limit: at most `amount` (GPU-hours, kWh or kg, by `currency`) charged to the
    account's subtree per `period`. One per account and currency."""

    __tablename__ = "account_limits"

    account: Mapped[str] = mapped_column(ForeignKey("accounts.name", ondelete="CASCADE"), primary_key=True)
    currency: Mapped[str] = mapped_column(String(16), primary_key=True)
    amount: Mapped[float] = mapped_column(Float)
    period: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


accounts = Account.__table__
account_users = AccountUser.__table__
account_limits = AccountLimit.__table__
