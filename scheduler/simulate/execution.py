"""Jobs running on the simulated cluster: starts, interruptible segments (a checkpoint job back
to the queue, a pause job idling on its GPUs), ends, and evictions (a failed GPU, a job
taken back behind an overrun), each change of power metered."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from scheduler.simulate.power import grams
from scheduler.simulate.records import EPS_S, JobRecord
from scheduler.simulate.state import SimState

log = logging.getLogger(__name__)


class Execution:
    """Runs the committed jobs of one simulation run on their GPUs, by its truth; `replan(now_s)`
    plans at once when a job comes back to the queue (a checkpoint, a blocked start)."""

    def __init__(self, state: SimState, replan: Callable[[float], None]) -> None:
        self.state = state
        self.replan = replan

    def start(self, idx: int, token: int) -> None:
        """A committed job's planned start: it runs, unless its GPUs still run the job before it."""
        state = self.state
        r = state.records[idx]
        if r.token != token or r.state != "committed":
            return
        env = state.env
        blocked = state.gpus.blocker(idx, r.gpu_ids)
        if blocked is not None:
            before = state.records[state.gpus.running_on[blocked]]
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
            state.replanned_behind_overruns += 1
            self.evict(idx, env.now, f"GPU {blocked} is still running the job before it")
            state.changes += 1
            self.replan(env.now)
            return
        state.events += 1
        now = env.now
        # started late: the planner's view moves with it
        state.gpus.occupy(idx, r.gpu_ids, now > r.start_s + EPS_S, now + r.planned_runtime_s)
        r.start_s = now
        if r.first_start_s is None:
            r.first_start_s = now
        r.state = "running"
        if not r.work_done_s:
            r.attempts += 1
        state.power.meter(r, env.now, r.power_w, r.pue)
        self._run_segment(idx, token)

    def _run_segment(self, idx: int, token: int) -> None:
        """Run the job's next stretch of work: to its end, or to the end of its planned
        segment, paying the resume cost first when it resumes."""
        state = self.state
        r = state.records[idx]
        now = state.env.now
        r.run_start_s = now
        resumed = r.work_done_s > 0 or r.job.resume_count > 0
        r.resume_paid_s = r.job.resume_cost_s if resumed else 0.0
        run_s = r.resume_paid_s + max(0.0, r.runtime_s - r.work_done_s)
        if r.segments:
            run_s = min(run_s, max(0.0, r.segments[r.seg_index][1] - now))
        ev = state.env.timeout(run_s)
        ev.callbacks.append(lambda _e, idx=idx, token=token: self._segment_end(idx, token))

    def _segment_end(self, idx: int, token: int) -> None:
        """A stretch of work ends: the job is done, or it is interrupted: a checkpoint job frees
        its GPUs and goes back to the queue with its progress; a pause job idles on its GPUs
        until its next segment."""
        state = self.state
        r = state.records[idx]
        if r.token != token or r.state != "running":
            return
        now = state.env.now
        ran = now - r.run_start_s
        r.work_done_s += max(0.0, ran - r.resume_paid_s)
        if r.work_done_s >= r.runtime_s - 1e-6 or not r.segments:
            self._finish(idx, token)
            return
        state.events += 1
        self._log_segment(r, now)
        state.power.meter(r, now, -r.power_w, r.pue)
        job = r.job
        progress = dict(done_fraction=min(1.0, r.work_done_s / r.runtime_s), resume_count=job.resume_count + 1)
        if job.interruptible == "pause" and r.seg_index + 1 < len(r.segments):
            r.seg_index += 1
            r.job = replace(job, **progress)
            state.power.meter(r, now, r.idle_w, r.pue)
            r.run_start_s = None  # paused
            gap_end = r.segments[r.seg_index][0]
            ev = state.env.timeout(max(0.0, gap_end - now))
            ev.callbacks.append(lambda _e, idx=idx, token=token, t0=now: self._resume_in_place(idx, token, t0))
            return
        # checkpointed: back to the queue with its progress, planned again like any job
        r.job = replace(job, **progress)
        if r.estimated_job is not None:
            r.estimated_job = replace(r.estimated_job, **progress)
        state.gpus.release(idx, r.gpu_ids, now)
        r.state = "queued"
        r.token += 1
        r.segments = []
        state.requeue(idx)
        state.changes += 1
        # back to PENDING is planned at once: the daemon's planner ticks every 15 s, so a
        # checkpointed job waits seconds, not the simulator's (often hourly) tick, for its plan
        self.replan(now)

    def _resume_in_place(self, idx: int, token: int, paused_s: float) -> None:
        """A paused job's next segment begins on the GPUs it held: its idle energy counted."""
        state = self.state
        r = state.records[idx]
        if r.token != token or r.state != "running":
            return
        state.events += 1
        now = state.env.now
        r.idle_energy_j += r.idle_w * (now - paused_s)
        r.idle_gco2 += grams(r.idle_w, r.pue, state.carbon[r.zone], paused_s, now)
        state.power.meter(r, now, r.power_w - r.idle_w, r.pue)
        self._run_segment(idx, token)

    def _log_segment(self, r: JobRecord, now: float) -> None:
        """Account the segment that ends now: its energy and grams, beside the others."""
        e = r.power_w * (now - r.run_start_s)
        g = grams(r.power_w, r.pue, self.state.carbon[r.zone], r.run_start_s, now)
        r.segment_log.append((r.run_start_s, now, e, g))
        r.energy_j += e
        r.gco2 += g

    def _finish(self, idx: int, token: int) -> None:
        state = self.state
        r = state.records[idx]
        if r.token != token or r.state != "running":
            return
        state.events += 1
        now = state.env.now
        state.power.meter(r, now, -r.power_w, r.pue)
        r.state = "done"
        r.end_s = now
        segmented = bool(r.segment_log)
        self._log_segment(r, now)  # one piece: its whole run; else its last segment
        if segmented:
            r.energy_j += r.idle_energy_j
            r.gco2 += r.idle_gco2
        state.gpus.release(idx, r.gpu_ids, now)
        if r.first_start_s is not None:
            r.start_s = r.first_start_s  # its wait ends at its first start
        if state.settings.learn and not segmented:
            state.knowledge.learn(r, state.workload_of)
        if state.knowledge.correct and not segmented:
            state.knowledge.learn_estimate(r)
        if state.priorities is not None:
            state.priorities.charge(r)
        state.job_done()

    def evict(self, idx: int, now_s: float, why: str) -> None:
        """Stop or un-commit a job (its GPU failed, or the job before it overran); it goes back
        to the queue. What a running job drew so far is counted as lost."""
        state = self.state
        r = state.records[idx]
        if r.state == "running":
            paused = r.run_start_s is None
            t0 = r.start_s if paused else r.run_start_s
            state.power.meter(r, now_s, -(r.idle_w if paused else r.power_w), r.pue)
            intensity = state.carbon[r.zone]
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
        state.gpus.release(idx, r.gpu_ids, now_s)
        log.debug("job %s back to the queue: %s", r.job.id, why)
        r.state = "queued"
        r.token += 1
        r.start_s = None
        r.gpu_ids = ()
        state.requeue(idx)
