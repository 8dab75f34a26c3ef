"""Pricing finished jobs: a job's carbon from its measured energy, its GPUs' power and the
recorded intensity of its zone, written on the job (see `scheduler.accounting`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from scheduler.accounting.config import AccountingConfig
from scheduler.accounting.run_carbon import IntensitySpan, RunCarbon, combine_runs, run_carbon
from scheduler.clock import utcnow
from scheduler.jobs.pricing import (FINISHED, accounting_row, never_priced, never_priced_where,
                                    priced_without_actuals, record_carbon)
from scheduler.samples import counter_note, power_series
from scheduler.store import Store
from scheduler.carbon_table import actual_periods
from scheduler.store.models import gpus, job_segments, nodes
from telemetry.grid.readings import KIND_ACTUAL, SIGNAL_AVERAGE
from telemetry.grid.static import static_intensity

log = logging.getLogger(__name__)


class NotFound(LookupError):
    """No such job."""


class Ledger:
    """Prices finished jobs and records their carbon on the job, over one store.

    `site` gives the PUE of a job's node (scheduler.site.SiteConfig, anything with
    `.pue(zone, node)`: the node's site, else its zone's default);
    `carbon` the signal per zone (scheduler.carbon.CarbonSignals, anything with
    `.signal_of(zone)` and `.config.static`), else one is built on first use from
    `carbon_config` (a CarbonConfig, or the parsed config file); all optional (PUE 1.0,
    the data's signal).
    """

    def __init__(self, store: Store, *, site: Any = None, carbon: Any = None, carbon_config: Any = None,
                 config: AccountingConfig | None = None, clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.site = site
        self._carbon = carbon
        self._carbon_config = carbon_config
        self.config = config or AccountingConfig()
        self.clock = clock

    @property
    def carbon(self) -> Any:
        """The signal store, built on first use (a report over priced jobs never needs it)."""
        if self._carbon is None:
            from scheduler.carbon import CarbonSignals
            from scheduler.carbon_config import CarbonConfig

            cfg = self._carbon_config
            if isinstance(cfg, Mapping):
                cfg = CarbonConfig.from_config(cfg)
            self._carbon = CarbonSignals(self.store, cfg, track_status=False)
        return self._carbon

    def emission_factor(self) -> str:
        cfg = self._carbon_config
        if isinstance(cfg, Mapping):
            return str((cfg.get("carbon") or {}).get("emission_factor", "direct"))
        return getattr(cfg or getattr(self._carbon, "config", None), "emission_factor", "direct")

    # -- one job ----------------------------------------------------------------------------

    def job_row(self, conn: Connection, job_id: int) -> dict:
        """One job's accounting columns (`scheduler.jobs.pricing.ACCOUNTING_COLUMNS`) by name."""
        row = accounting_row(conn, job_id)
        if row is None:
            raise NotFound(f"no job {job_id}")
        return row

    def placement(self, conn: Connection, job: dict) -> tuple[str | None, str | None]:
        zone, model = job.get("zone"), job.get("gpu_model")
        if zone is None and job.get("node"):
            zone = conn.execute(select(nodes.c.zone).where(nodes.c.name == job["node"])).scalar()
        if model is None and job.get("gpu_ids"):
            model = conn.execute(select(gpus.c.model).where(gpus.c.id == int(job["gpu_ids"][0]))).scalar()
        return zone, model

    def pue(self, zone: str | None, node: str | None = None) -> float:
        """The PUE of the site of the job's node (its zone's default when the site has none)."""
        if self.site is None:
            return 1.0
        return float(self.site.pue(zone, node))

    def signal(self, zone: str | None) -> str | None:
        if zone is None:
            return None
        sig = self.carbon.signal_of(zone)
        if sig is None and static_intensity(zone, self.static_overrides()) is not None:
            sig = SIGNAL_AVERAGE
        return sig

    def static_overrides(self) -> dict[str, float]:
        cfg = getattr(self.carbon, "config", None)
        return dict(getattr(cfg, "static", {}) or {})

    def intensity_spans(self, conn: Connection, zone: str, signal: str | None, start: datetime,
                        end: datetime) -> list[IntensitySpan]:
        """Recorded values of `zone` over [start, end) (newest issue of each period; a later
        period cuts an earlier one short), with the gaps between them filled by the static
        yearly mean where the signal is average and a static value exists."""
        spans = [IntensitySpan(p.start, p.end, p.gco2_per_kwh, KIND_ACTUAL, p.source)
                 for p in actual_periods(conn, zone, signal, start, end)] if signal is not None else []
        static = static_intensity(zone, self.static_overrides()) if signal in (None, SIGNAL_AVERAGE) else None
        if static is not None:
            cur = start
            filled: list[IntensitySpan] = []
            for s in spans:
                if s.start > cur:
                    filled.append(IntensitySpan(cur, s.start, static.gco2_per_kwh, "static", "static"))
                cur = max(cur, s.end)
            if cur < end or start == end and not spans:
                filled.append(IntensitySpan(cur, max(end, cur + timedelta(seconds=1)), static.gco2_per_kwh,
                                            "static", "static"))
            spans = sorted(spans + filled, key=lambda s: s.start)
        return spans

    def segments(self, conn: Connection, job: dict) -> list:
        if not job.get("interruptible"):
            return []
        return list(conn.execute(select(job_segments).where(job_segments.c.job_id == job["id"])
                                 .order_by(job_segments.c.seq)))

    def price_segments(self, conn: Connection, job: dict, rows: list) -> tuple[RunCarbon | None, dict, list[dict]]:
        """The carbon of an interruptible job: each segment priced over its own window,
        on its own node's zone and GPUs (a checkpoint job may move), and the sums. Returns
        the job's carbon, its column values and each segment's gCO2 ({id, gco2})."""
        zone, model = self.placement(conn, job)
        pue = self.pue(zone, job.get("node"))
        signal = self.signal(zone)
        values: dict[str, Any] = {"zone": zone, "gpu_model": model, "pue": pue, "gco2_signal": signal}
        runs: list[RunCarbon] = []
        updates: list[dict] = []
        for seg in rows:
            seg_zone = zone
            if seg.node and seg.node != job.get("node"):
                seg_zone = conn.execute(select(nodes.c.zone).where(nodes.c.name == seg.node)).scalar() or zone
            if seg.energy_j is None or seg_zone is None:
                updates.append({"id": seg.id, "gco2": None})
                continue
            gpu_ids = [int(g) for g in (seg.gpu_ids or [])]
            series, weighting = power_series(conn, gpu_ids, seg.started_at.timestamp(), seg.ended_at.timestamp())
            spans = self.intensity_spans(conn, seg_zone, self.signal(seg_zone), seg.started_at, seg.ended_at)
            run = run_carbon(float(seg.energy_j), seg.started_at, seg.ended_at, spans,
                             pue=self.pue(seg_zone, seg.node), gpu_power=series, weighting=weighting)
            runs.append(run)
            updates.append({"id": seg.id, "gco2": run.gco2})
        if not runs:
            values.update(gco2=None, gco2_basis=None, gco2_coverage=None)
            return None, values, updates
        total = combine_runs(runs)
        values.update(gco2=total.gco2, gco2_basis=total.basis, gco2_coverage=total.coverage)
        return total, values, updates

    def price_job(self, conn: Connection, job: dict) -> tuple[RunCarbon | None, dict]:
        """The carbon of a job's run and the column values that record it (an interruptible
        job's: the sum over its segments, `price_segments`)."""
        rows = self.segments(conn, job)
        if rows:
            run, values, _ = self.price_segments(conn, job, rows)
            return run, values
        zone, model = self.placement(conn, job)
        pue = self.pue(zone, job.get("node"))
        signal = self.signal(zone)
        values: dict[str, Any] = {"zone": zone, "gpu_model": model, "pue": pue, "gco2_signal": signal}
        started, ended, energy_j = job.get("started_at"), job.get("ended_at"), job.get("energy_j")
        if started is None or ended is None or energy_j is None or zone is None:
            values.update(gco2=None, gco2_basis=None, gco2_coverage=None)
            return None, values
        gpu_ids = [int(g) for g in (job.get("gpu_ids") or [])]
        series, weighting = power_series(conn, gpu_ids, started.timestamp(), ended.timestamp())
        spans = self.intensity_spans(conn, zone, signal, started, ended)
        run = run_carbon(float(energy_j), started, ended, spans, pue=pue, gpu_power=series, weighting=weighting)
        values.update(gco2=run.gco2, gco2_basis=run.basis, gco2_coverage=run.coverage)
        if job.get("energy_note") is None and (job.get("energy_method") or "").startswith("integral"):
            note = counter_note(conn, gpu_ids, started.timestamp(), ended.timestamp())
            if note:
                values["energy_note"] = note
        return run, values

    def price_other_signal(self, conn: Connection, job: dict, signal: str) -> float | None:
        """The grams of a finished, uninterrupted job's run priced with `signal` instead of
        its zone's own, where recorded actuals of that signal cover the whole run (no static
        fill, no gaps); None otherwise. What a receipt shows beside its own signal's grams,
        never added to them."""
        zone, started, ended, energy_j = job.get("zone"), job.get("started_at"), job.get("ended_at"), job.get("energy_j")
        if zone is None or started is None or ended is None or energy_j is None or ended <= started:
            return None
        spans = [IntensitySpan(p.start, p.end, p.gco2_per_kwh, KIND_ACTUAL, p.source)
                 for p in actual_periods(conn, zone, signal, started, ended)]
        if not spans:
            return None
        gpu_ids = [int(g) for g in (job.get("gpu_ids") or [])]
        series, weighting = power_series(conn, gpu_ids, started.timestamp(), ended.timestamp())
        run = run_carbon(float(energy_j), started, ended, spans, pue=job.get("pue") or 1.0, gpu_power=series,
                         weighting=weighting)
        return run.gco2 if run.basis == "actual" and not run.gaps else None

    def account(self, job_id: int, *, energy_note: str | None = None, tokens: int | None = None) -> RunCarbon | None:
        """Price a finished job and record it on the job (gco2, zone, model, PUE, signal,
        basis, coverage, accounted_at). Safe to repeat; returns the run's carbon (None if it
        cannot be priced: not measured, never ran)."""
        def tx(conn: Connection) -> RunCarbon | None:
            job = self.job_row(conn, job_id)
            if job["state"] not in FINISHED:
                raise ValueError(f"job {job_id} is {job['state']}: only finished jobs are accounted")
            if energy_note is not None:
                job["energy_note"] = energy_note
            rows = self.segments(conn, job)
            if rows:
                run, values, seg_gco2 = self.price_segments(conn, job, rows)
                for u in seg_gco2:
                    conn.execute(update(job_segments).where(job_segments.c.id == u["id"]).values(gco2=u["gco2"]))
            else:
                run, values = self.price_job(conn, job)
            if energy_note is not None:
                values["energy_note"] = energy_note
            if tokens is not None:
                values["tokens"] = int(tokens)
            values["accounted_at"] = self.clock()
            record_carbon(conn, job_id, values)
            return run

        run = self.store.transact(tx)
        log.debug("job %s accounted: %s gCO2 (%s)", job_id, None if run is None else run.gco2,
                  None if run is None else run.basis)
        return run

    def backfill(self, *, limit: int = 500, ids: Iterable[int] | None = None) -> int:
        """Price finished jobs that were never priced, and re-price those priced without
        full actuals (ended within `recheck_days`) once more data may be in; returns how many
        were priced. For the daemon's periodic job and for reports."""
        now = self.clock()
        recheck_from = now - timedelta(days=self.config.recheck_days)
        retry_before = now - timedelta(hours=1)
        with self.store.read() as conn:
            if ids is not None:
                todo = list(ids)
            else:
                todo = never_priced(conn, limit)
                if len(todo) < limit:
                    todo += priced_without_actuals(conn, recheck_from, retry_before, limit - len(todo))
        done = 0
        for job_id in todo:
            try:
                self.account(job_id)
                done += 1
            except (NotFound, ValueError) as e:  # deleted or re-queued meanwhile
                log.info("job %s not accounted: %s", job_id, e)
        if done:
            log.info("accounted the carbon of %d finished job(s)", done)
        return done

    def price_missing(self, where: Any, limit: int = 200) -> None:
        """Price up to `limit` finished jobs matching `where` (a condition on `jobs`) that were
        never priced, before a report or export over them (carbon data may arrive after a job
        ends)."""
        with self.store.read() as conn:
            missing = never_priced_where(conn, where, limit)
        if missing:
            self.backfill(ids=missing)
