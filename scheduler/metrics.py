"""Prometheus metrics for the daemon and the node agent (`--metrics-port`).

Names follow the exporter conventions: a `carbonsched_` prefix, base units in the name
(`_watts`, `_joules`, `_grams`, `_seconds`, `_ratio`), `_total` on counters.

`method` says whether a figure is `measured` (a real GPU's readings) or `modelled` (an
emulated GPU: the emulator's power model, not a measurement), so no dashboard can present
an emulated fleet's watts, joules or grams as measured.

| metric | type | labels | meaning |
|---|---|---|---|
| carbonsched_gpu_power_watts | gauge | node, gpu, uuid, model, method | latest power reading |
| carbonsched_gpu_energy_joules_total | counter | node, gpu, uuid, model, method | the device's energy counter |
| carbonsched_gpu_utilization_ratio | gauge | node, gpu, uuid, model, method | busy fraction, 0-1 |
| carbonsched_gpu_healthy | gauge | node, gpu, uuid, model, method | 1 healthy, 0 lost |
| carbonsched_gpu_power_limit_watts | gauge | node, gpu, uuid, model, method | enforced board power limit now |
| carbonsched_gpu_power_limit_min_watts | gauge | node, gpu, uuid, model, method | lowest settable power limit |
| carbonsched_gpu_power_limit_max_watts | gauge | node, gpu, uuid, model, method | highest settable power limit |
| carbonsched_gpu_sampler_reads_total | counter | node | device reads by the sampler |
| carbonsched_gpu_sampler_errors_total | counter | node | failed device reads |
| carbonsched_gpu_sampler_cpu_seconds_total | counter | node | CPU time of the sampling thread |
| carbonsched_jobs | gauge | state | jobs in the store by state (daemon) |
| carbonsched_job_energy_joules_total | counter | method | energy of finished jobs (daemon) |
| carbonsched_job_gco2_grams_total | counter | method, signal | gCO2 of finished jobs per carbon signal, average or marginal, never added together (daemon) |
| carbonsched_job_prompts_total | counter | method, source, signal | prompts of finished jobs with a gCO2 figure, reported by the job or declared at submit (daemon) |
| carbonsched_job_prompts_gco2_grams_total | counter | method, source, signal | gCO2 of those same jobs: the ratio of the two rates is gCO2 per prompt (daemon) |
| carbonsched_job_output_tokens_total | counter | method, source, signal | output tokens of finished jobs with a gCO2 figure (daemon) |
| carbonsched_job_tokens_gco2_grams_total | counter | method, source, signal | gCO2 of those jobs: with the tokens, gCO2 per 1k tokens (daemon) |
| carbonsched_job_tokens_energy_joules_total | counter | method, source, signal | their energy: with the tokens, tokens per joule (daemon) |
| carbonsched_job_embodied_grams_total | counter | method, part | embodied gCO2e of jobs that ran: their GPU-hours' share of making the GPUs (part="gpu") and, where a figure exists, the host (part="host"); never added to the gCO2 series (daemon) |
| carbonsched_job_embodied_unknown_gpu_seconds_total | counter | method | GPU-seconds of jobs that ran on models without an embodied figure: unknown, not zero (daemon) |
| carbonsched_planner_duration_seconds | histogram | policy | planner tick wall time (daemon) |
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler.accounting.embodied import g_per_gpu_second
from scheduler.jobs.store import count_by_state
from scheduler.jobs.sums import embodied_totals, energy_and_gco2_totals, work_totals
from scheduler.lifecycle import State
from scheduler.store import Store
from telemetry.grid.readings import SIGNAL_AVERAGE, SIGNAL_MARGINAL

SIGNALS = (SIGNAL_AVERAGE, SIGNAL_MARGINAL)  # the first: what an unnamed signal was priced with

log = logging.getLogger(__name__)


class GpuCollector:
    """GPU readings of one agent, taken from its sampler at scrape time."""

    def __init__(self, agent) -> None:
        self.agent = agent

    def collect(self):
        labels = ["node", "gpu", "uuid", "model", "method"]
        method = "modelled" if getattr(self.agent.backend, "emulated", False) else "measured"
        power = GaugeMetricFamily("carbonsched_gpu_power_watts", "Latest GPU power reading", labels=labels)
        energy = CounterMetricFamily("carbonsched_gpu_energy_joules", "GPU energy counter", labels=labels)
        util = GaugeMetricFamily("carbonsched_gpu_utilization_ratio", "GPU busy fraction", labels=labels)
        healthy = GaugeMetricFamily("carbonsched_gpu_healthy", "1 if the GPU is usable", labels=labels)
        limit_now = GaugeMetricFamily("carbonsched_gpu_power_limit_watts", "Enforced board power limit",
                                      labels=labels)
        limit_min = GaugeMetricFamily("carbonsched_gpu_power_limit_min_watts", "Lowest settable power limit",
                                      labels=labels)
        limit_max = GaugeMetricFamily("carbonsched_gpu_power_limit_max_watts", "Highest settable power limit",
                                      labels=labels)
        limits = self.agent.power.current
        node = self.agent.config.node
        latest = self.agent.sampler.latest()
        lost = self.agent.sampler.lost()
        for d in self.agent.devices:  # as registered: a lost GPU stays visible, unhealthy
            lv = [node, f"{d.vendor}:{d.index}", d.uuid, d.model, method]
            healthy.add_metric(lv, 0.0 if d.uuid in lost else 1.0)
            limit = limits.get(d.uuid)
            for family, value in ((limit_now, limit and limit.current_w), (limit_min, limit and limit.min_w),
                                  (limit_max, limit and limit.max_w)):
                if value is not None:
                    family.add_metric(lv, value)
            r = latest.get(d.uuid)
            if r is None:
                continue
            if r.power_w is not None:
                power.add_metric(lv, r.power_w)
            if r.energy_j is not None:
                energy.add_metric(lv, r.energy_j)
            if r.utilization_pct is not None:
                util.add_metric(lv, r.utilization_pct / 100.0)
        stats = self.agent.sampler.stats
        reads = CounterMetricFamily("carbonsched_gpu_sampler_reads", "Device reads", labels=["node"])
        reads.add_metric([node], stats.reads)
        errors = CounterMetricFamily("carbonsched_gpu_sampler_errors", "Failed device reads", labels=["node"])
        errors.add_metric([node], stats.errors)
        cpu = CounterMetricFamily("carbonsched_gpu_sampler_cpu_seconds", "Sampler thread CPU time",
                                  labels=["node"])
        cpu.add_metric([node], stats.cpu_s)
        yield from (power, energy, util, healthy, limit_now, limit_min, limit_max, reads, errors, cpu)


class StoreCollector:
    """Queue depth and job totals, read from the store at most once per `max_age_s`: the
    queries scan the jobs table, and a scrape (or a thousand) in between is served the
    figures of the last one (one query at a time; concurrent scrapes wait for it)."""

    def __init__(self, store: Store, *, max_age_s: float = 10.0, clock=time.monotonic) -> None:
        self.store = store
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list] | None = None  # (read at, metric families)

    def collect(self):
        with self._lock:
            now = self._clock()
            if self._cached is None or now - self._cached[0] >= self.max_age_s:
                self._cached = (now, list(self._read()))
            families = self._cached[1]
        yield from families

    def _read(self):
        depth = GaugeMetricFamily("carbonsched_jobs", "Jobs by state", labels=["state"])
        with self.store.read() as conn:
            counts = count_by_state(conn)
            energy_by_method = {m: 0.0 for m in ("measured", "modelled")}
            gco2_by = {(m, sig): 0.0 for m in ("measured", "modelled") for sig in SIGNALS}
            # grams of the average and of the marginal signal are different quantities: never
            # one series (NULL: priced before signals were recorded, at the static average)
            for is_modelled, sig, energy, gco2 in energy_and_gco2_totals(conn):
                m = "modelled" if is_modelled else "measured"
                energy_by_method[m] += float(energy)
                gco2_by[(m, sig)] = gco2_by.get((m, sig), 0.0) + float(gco2)
            # the work done: reported by the job (its metrics file), else declared at submit
            work = work_totals(conn)
            embodied = embodied_totals(conn, g_per_gpu_second())
        for state in State:
            depth.add_metric([state.value], counts.get(state.value, 0))
        e = CounterMetricFamily("carbonsched_job_energy_joules", "Energy of finished jobs, measured or "
                                "modelled (emulated GPUs)", labels=["method"])
        g = CounterMetricFamily("carbonsched_job_gco2_grams", "gCO2 of finished jobs, from measured or "
                                "modelled (emulated GPUs) energy, per carbon signal (average or marginal: "
                                "never add the two)", labels=["method", "signal"])
        for m, energy in energy_by_method.items():
            e.add_metric([m], energy)
        for (m, sig), gco2 in sorted(gco2_by.items()):
            g.add_metric([m, sig], gco2)
        labels = ["method", "source", "signal"]
        p = CounterMetricFamily("carbonsched_job_prompts", "Prompts of finished jobs with a gCO2 figure, as "
                                "reported by the job or declared at submit", labels=labels)
        pg = CounterMetricFamily("carbonsched_job_prompts_gco2_grams", "gCO2 of finished jobs that count prompts",
                                 labels=labels)
        t = CounterMetricFamily("carbonsched_job_output_tokens", "Output tokens of finished jobs with a gCO2 "
                                "figure, as reported by the job or declared at submit", labels=labels)
        tg = CounterMetricFamily("carbonsched_job_tokens_gco2_grams", "gCO2 of finished jobs that count tokens",
                                 labels=labels)
        tj = CounterMetricFamily("carbonsched_job_tokens_energy_joules", "Energy of finished jobs that count "
                                 "tokens", labels=labels)
        sums = {(what, m, src, sig): (n, grams, joules)
                for what, rows in work.items() for m, src, sig, n, grams, joules in rows}
        signals = sorted(set(SIGNALS) | {k[3] for k in sums})
        for m in ("measured", "modelled"):  # every series exists from the start, at 0
            for src in ("reported", "declared"):
                for sig in signals:
                    n, grams, _ = sums.get(("prompts", m, src, sig), (0, 0.0, 0.0))
                    p.add_metric([m, src, sig], float(n))
                    pg.add_metric([m, src, sig], float(grams))
                    n, grams, joules = sums.get(("tokens", m, src, sig), (0, 0.0, 0.0))
                    t.add_metric([m, src, sig], float(n))
                    tg.add_metric([m, src, sig], float(grams))
                    tj.add_metric([m, src, sig], float(joules))
        yield from (depth, e, g, p, pg, t, tg, tj, *_embodied_families(embodied))


def _embodied_families(rows) -> tuple:
    """The embodied series from `embodied_totals` rows, every series present from the start."""
    grams = CounterMetricFamily("carbonsched_job_embodied_grams", "Embodied gCO2e of jobs that ran (their "
                                "GPU-hours' share of making the GPUs, and the host where a figure exists); "
                                "never added to the gCO2 series", labels=["method", "part"])
    unknown = CounterMetricFamily("carbonsched_job_embodied_unknown_gpu_seconds", "GPU-seconds of jobs that ran "
                                  "on GPU models without an embodied figure (unknown, not zero)", labels=["method"])
    by_m = {("modelled" if m else "measured"): (gpu_g, host_g, unknown_s) for m, gpu_g, host_g, _, unknown_s in rows}
    for m in ("measured", "modelled"):
        gpu_g, host_g, unknown_s = by_m.get(m, (0.0, 0.0, 0.0))
        grams.add_metric([m, "gpu"], float(gpu_g))
        grams.add_metric([m, "host"], float(host_g))
        unknown.add_metric([m], float(unknown_s))
    return grams, unknown


class Metrics:
    """A registry of our own (no global state) and the HTTP endpoint serving it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.planner_duration = Histogram(
            "carbonsched_planner_duration_seconds", "Planner tick wall time", ["policy"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry)
        self.governor_actions = Counter(
            "carbonsched_governor_actions", "Power limits of running jobs changed by the power governor",
            ["zone", "direction"], registry=self.registry)
        self.zone_power = Gauge("carbonsched_zone_power_watts", "Measured power of a budgeted zone's site: its "
                                "GPUs plus its configured static power", ["zone"], registry=self.registry)
        self.zone_power_cap = Gauge("carbonsched_zone_power_cap_watts", "Power cap of a zone's site in force now",
                                    ["zone"], registry=self.registry)
        self._server = None

    def add(self, collector) -> None:
        self.registry.register(collector)

    def serve(self, port: int, addr: str = "127.0.0.1", **bounds) -> None:
        """Serve /metrics on (addr, port) in a thread; `bounds` are MetricsServer's
        (max_connections, read_timeout_s, deadline_s)."""
        from scheduler.metrics_http import MetricsServer

        self._server = MetricsServer(addr, port, self.registry, **bounds)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                         name="metrics", daemon=True).start()
        log.info("Prometheus metrics on http://%s:%d/metrics (at most %d connections, %gs each)", addr,
                 self._server.server_address[1], self._server.max_connections, self._server.deadline_s)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
