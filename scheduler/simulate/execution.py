"""Jobs running on the simulated cluster: starts, interruptible segments (a checkpoint job back
to the queue, a pause job idling on its GPUs), ends, and evictions (a failed GPU, a job
taken back behind an overrun), each change of power metered."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from scheduler.simulate.power import grams
from scheduler.simulate.records import EPS_S, JobRecord

if TYPE_CHECKING:
    from scheduler.simulate.model import Simulation

log = logging.getLogger(__name__)


class Execution:
    """Runs the committed jobs of one `Simulation` on their GPUs, by its truth."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def start(self, idx: int, token: int) -> None:
        """A committed job's planned start: it runs, unless its GPUs still run the job before it."""
        sim = self.sim
        r = sim.records[idx]
        if r.token != token or r.state != "committed":
            return
        env = sim.env
        blocked = sim.gpus.blocker(idx, r.gpu_ids)
        if blocked is not None:
            before = sim.records[sim.gpus.running_on[blocked]]
            before_end = before.start_s + before.runtime_s
            if before_end <= env.now + EPS_S:
                # it ends at this very instant (its end is simply processed after this start, or
                # a float hair later): start right after it, as planned. Waiting 0 s where its end
                # lies a hair ahead would spin at this instant for ever.
                ev = env.timeout(max(0.0, before_end - env.now))
                ev.callbacks.append(lambda _e, idx=idx, token=token: self.start(idx, token))
                return
            # the job before it overran: its plan assumed GPUs that are not free. Like an agent
            # that cannot claim them, hand it back; the planner places it again at once.
            sim.replanned_behind_overruns += 1
            self.evict(idx, env.now, f"GPU {blocked} is still running the job before it")
            sim.changes += 1
            sim.planner.plan(env.now)
            return
        sim.events += 1
        now = env.now
        # started late: the planner's view moves with it
        sim.gpus.occupy(idx, r.gpu_ids, now > r.start_s + EPS_S, now + r.planned_runtime_s)
        r.start_s = now
        if r.first_start_s is None:
            r.first_start_s = now
        r.state = "running"
        if not r.work_done_s:
            r.attempts += 1
        sim.power.meter(r, env.now, r.power_w, r.pue)
        self._run_segment(idx, token)

    def _run_segment(self, idx: int, token: int) -> None:
        """Run the job's next stretch of work: to its end, or to the end of its planned
        segment, paying the resume cost first when it resumes."""
        sim = self.sim
        r = sim.records[idx]
        now = sim.env.now
        r.run_start_s = now
        resumed = r.work_done_s > 0 or r.job.resume_count > 0
        r.resume_paid_s = r.job.resume_cost_s if resumed else 0.0
        run_s = r.resume_paid_s + max(0.0, r.runtime_s - r.work_done_s)
        if r.segments:
            run_s = min(run_s, max(0.0, r.segments[r.seg_index][1] - now))
        ev = sim.env.timeout(run_s)
        ev.callbacks.append(lambda _e, idx=idx, token=token: self._segment_end(idx, token))

    def _segment_end(self, idx: int, token: int) -> None:
        """A stretch of work ends: the job is done, or it is interrupted: a checkpoint job frees
        its GPUs and goes back to the queue with its progress; a pause job idles on its GPUs
        until its next segment."""
        sim = self.sim
        r = sim.records[idx]
        if r.token != token or r.state != "running":
            return
        now = sim.env.now
        ran = now - r.run_start_s
        r.work_done_s += max(0.0, ran - r.resume_paid_s)
        if r.work_done_s >= r.runtime_s - 1e-6 or not r.segments:
            self._finish(idx, token)
            return
        sim.events += 1
        self._log_segment(r, now)
        sim.power.meter(r, now, -r.power_w, r.pue)
        job = r.job
        progress = dict(done_fraction=min(1.0, r.work_done_s / r.runtime_s), resume_count=job.resume_count + 1)
        if job.interruptible == "pause" and r.seg_index + 1 < len(r.segments):
            r.seg_index += 1
            r.job = replace(job, **progress)
            sim.power.meter(r, now, r.idle_w, r.pue)
            r.run_start_s = None  # paused
            gap_end = r.segments[r.seg_index][0]
            ev = sim.env.timeout(max(0.0, gap_end - now))
            ev.callbacks.append(lambda _e, idx=idx, token=token, t0=now: self._resume_in_place(idx, token, t0))
            return
        # checkpointed: back to the queue with its progress, planned again like any job
        r.job = replace(job, **progress)
        if r.estimated_job is not None:
            r.estimated_job = replace(r.estimated_job, **progress)
        sim.gpus.release(idx, r.gpu_ids, now)
        r.state = "queued"
        r.token += 1
        r.segments = []
        sim.requeue(idx)
        sim.changes += 1
        # back to PENDING is planned at once: the daemon's planner ticks every 15 s, so a
        # checkpointed job waits seconds, not the simulator's (often hourly) tick, for its plan
        sim.planner.plan(now)

    def _resume_in_place(self, idx: int, token: int, paused_s: float) -> None:
        """A paused job's next segment begins on the GPUs it held: its idle energy counted."""
        sim = self.sim
        r = sim.records[idx]
        if r.token != token or r.state != "running":
            return
        sim.events += 1
        now = sim.env.now
        r.idle_energy_j += r.idle_w * (now - paused_s)
        r.idle_gco2 += grams(r.idle_w, r.pue, sim.carbon[r.zone], paused_s, now)
        sim.power.meter(r, now, r.power_w - r.idle_w, r.pue)
        self._run_segment(idx, token)

    def _log_segment(self, r: JobRecord, now: float) -> None:
        """Account the segment that ends now: its energy and grams, beside the others."""
        e = r.power_w * (now - r.run_start_s)
        g = grams(r.power_w, r.pue, self.sim.carbon[r.zone], r.run_start_s, now)
        r.segment_log.append((r.run_start_s, now, e, g))
        r.energy_j += e
        r.gco2 += g

    def _finish(self, idx: int, token: int) -> None:
        sim = self.sim
        r = sim.records[idx]
        if r.token != token or r.state != "running":
            return
        sim.events += 1
        now = sim.env.now
        sim.power.meter(r, now, -r.power_w, r.pue)
        r.state = "done"
        r.end_s = now
        segmented = bool(r.segment_log)
        self._log_segment(r, now)  # one piece: its whole run; else its last segment
        if segmented:
            r.energy_j += r.idle_energy_j
            r.gco2 += r.idle_gco2
        sim.gpus.release(idx, r.gpu_ids, now)
        if r.first_start_s is not None:
            r.start_s = r.first_start_s  # its wait ends at its first start
        if sim.settings.learn and not segmented:
            sim.knowledge.learn(r, sim.workload_of)
        if sim.knowledge.correct and not segmented:
            sim.knowledge.learn_estimate(r)
        sim.job_done()

    def evict(self, idx: int, now_s: float, why: str) -> None:
        """Stop or un-commit a job (its GPU failed, or the job before it overran); it goes back
        to the queue. What a running job drew so far is counted as lost."""
        sim = self.sim
        r = sim.records[idx]
        if r.state == "running":
            paused = r.run_start_s is None
            t0 = r.start_s if paused else r.run_start_s
            sim.power.meter(r, now_s, -(r.idle_w if paused else r.power_w), r.pue)
            intensity = sim.carbon[r.zone]
            if paused:  # its idle time so far was spent holding the GPUs
                since = r.segment_log[-1][1] if r.segment_log else now_s
                r.lost_energy_j += r.idle_w * (now_s - since)
                r.lost_gco2 += grams(r.idle_w, r.pue, intensity, since, now_s)
            else:
                ran = now_s - t0
                r.lost_energy_j += r.power_w * ran
                r.lost_gco2 += grams(r.power_w, r.pue, intensity, t0, now_s)
            # work since the last checkpoint is lost; a pause job's progress was never saved
            if r.job.interruptible != "checkpoint":
                r.work_done_s = 0.0
                r.job = replace(r.job, done_fraction=0.0, resume_count=0)
            r.segments = []
        sim.gpus.release(idx, r.gpu_ids, now_s)
        log.debug("job %s back to the queue: %s", r.job.id, why)
        r.state = "queued"
        r.token += 1
        r.start_s = None
        r.gpu_ids = ()
        sim.requeue(idx)
