"""How a job really runs on an emulated fleet: the agent's side of a hidden truth.

`carbonsched daemon|agent --emulate FLEET --truth SPEC` runs emulated GPUs whose jobs follow
a truth (`scheduler.simulate.truth`: `perfect`, `noisy:SIGMA`, `profiles:FILE`) instead of
the planner's estimates, so that the daemon's learning and planning can be judged against
figures they cannot see. The truth lives here, in the agent, and nowhere else: the planner
(its own process, or its thread in the daemon) builds its snapshots from the store, where
only measured runs arrive (tests/node/test_emulation_truth.py checks both the imports and the
plans).

When the agent starts a job on emulated GPUs, `JobEmulation.begin`:

* asks the truth for the job's runtime and power on that GPU model, given the shape the seed
  profiles give it (`policies.model.energy.job_shape` over `seed_profiles()`: the planner's figures
  before it learned anything, so the truth never drifts with what is learned), moved to the
  operating point the plan chose (`policies.model.energy.point_change`: a job planned at batch 256
  runs as the performance model says batch 256 runs, where the seed shape is at batch 512);
* sets each of the job's GPUs to draw the truth's power (`EmulatedBackend.set_busy_power_w`);
* tells the job how long its work takes, since a job is a real process that the emulator
  cannot slow down: the **emulation seam** is two environment variables,

      CARBONSCHED_EMULATED_S_PER_PROMPT   seconds of the whole job per prompt (workload jobs
                                          with a prompt count)
      CARBONSCHED_EMULATED_RUNTIME_S      the whole run, seconds

  A job written for emulation paces its work by them (`examples/jobs/tiny_batch.py` does:
  it sleeps prompts x S_PER_PROMPT over its batches); any other job runs as it runs, and
  only the power follows the truth. Real GPUs never get these variables.

The runtime the agent measures is the job's real wall time (start-up included), as on a real
cluster; the energy is the emulator's integral of the truth's power over it. A job adopted
after an agent restart draws the load model's power (the truth is applied at launch only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from policies.model.energy import ProfileBook, job_shape, point_change, seed_profiles
from policies.types import QueuedJob
from policies.model.perf_model import OperatingPoint
from policies.pricing.power_cap import capped
from scheduler.simulate.truth import Truth, parse_truth
from telemetry.gpu import EmulatedBackend, GpuBackend

log = logging.getLogger(__name__)

ENV_S_PER_PROMPT = "CARBONSCHED_EMULATED_S_PER_PROMPT"
ENV_RUNTIME_S = "CARBONSCHED_EMULATED_RUNTIME_S"
DEFAULT_RUNTIME_S = 3600.0  # a job without --est-runtime, as the planner assumes


class EmulationError(ValueError):
    """A --truth that cannot be used (no emulated fleet, a bad spec); the message says why."""


@dataclass(frozen=True)
class EmulatedRun:
    """How one job really runs: its runtime, its power per GPU, and what the job is told."""

    runtime_s: float
    power_w_per_gpu: float
    env: dict[str, str]


class JobEmulation:
    """The truth of an emulated fleet, applied to each job the agent starts."""

    def __init__(self, truth: Truth, backend: EmulatedBackend, *,
                 default_runtime_s: float = DEFAULT_RUNTIME_S) -> None:
        self.truth = truth
        self.backend = backend
        self.default_runtime_s = default_runtime_s
        self._seeds = ProfileBook(seed_profiles())

    def run_of(self, job, model: str, gpus: int) -> EmulatedRun:
        """The truth for `job` (a jobs row: workload, prompts, est_runtime_s, ...) on `gpus`
        GPUs of `model`. The job's work, not its plan: it is not the planner's
        `scheduler.jobs.job.queued_job`, which plans an est-less job at a --time-limit below
        the default runtime and picks an inference job's operating point under its latency
        SLOs; the truth gives such jobs the default runtime and the unconstrained point (the
        plan's point, where it chose one, is applied below)."""
        queued = QueuedJob(id=job.id, gpus=gpus, gpu_mem_gib=job.gpu_mem_gib or 0.0,
                           submitted_at=job.submitted_at, est_runtime_s=job.est_runtime_s,
                           workload=job.workload, prompts=job.prompts)
        seed = job_shape(queued, model, self._seeds, self.default_runtime_s)
        runtime_s, power_w = self.truth.actual(queued, model, seed, self.default_runtime_s)
        planned_batch = getattr(job, "planned_max_batch", None)
        if planned_batch:  # the job runs at the plan's operating point, not the seed shape's
            slower, power = point_change(queued, model, OperatingPoint(
                int(planned_batch), getattr(job, "planned_precision", None) or "bf16",
                int(getattr(job, "planned_tp", None) or 1)))
            runtime_s, power_w = runtime_s * slower, power_w * power
        env = {ENV_RUNTIME_S: f"{runtime_s:.6g}"}
        if job.prompts:
            env[ENV_S_PER_PROMPT] = f"{runtime_s / job.prompts:.6g}"
        return EmulatedRun(runtime_s=runtime_s, power_w_per_gpu=power_w / max(1, gpus), env=env)

    def begin(self, job, model: str, uuids: list[str], *, power_limit_w: float | None = None) -> dict[str, str]:
        """Set the job's GPUs to draw the truth's power in their busy period (the agent marks
        them busy once the job is launched) and return the environment the job is told its
        pace by. Under a power limit below the truth's draw the GPUs draw the limit and the
        job is told the slower pace of the cap response (`policies.pricing.power_cap`)."""
        try:
            run = self.run_of(job, model, len(uuids))
        except (ValueError, ArithmeticError) as e:  # never fail a launch over the emulation
            log.error("job %s: the truth %s cannot describe it (%s); its GPUs draw the load model's power",
                      job.id, self.truth.name, e)
            return {}
        if power_limit_w is not None:
            vendor = next((d.vendor for d in self.backend.devices() if d.uuid in set(uuids)), None)
            factor, power_w = capped(run.power_w_per_gpu, power_limit_w, vendor)
            runtime_s = run.runtime_s * factor
            env = {ENV_RUNTIME_S: f"{runtime_s:.6g}"}
            if job.prompts:
                env[ENV_S_PER_PROMPT] = f"{runtime_s / job.prompts:.6g}"
            run = EmulatedRun(runtime_s=runtime_s, power_w_per_gpu=power_w, env=env)
        for uuid in uuids:
            self.backend.set_busy_power_w(uuid, run.power_w_per_gpu)
        log.info("job %s on emulated %s: by the truth (%s) %.1f s at %.0f W per GPU", job.id, model,
                 self.truth.name, run.runtime_s, run.power_w_per_gpu)
        return run.env


def make_emulation(truth_spec: str | None, backend: GpuBackend, *, seed: int = 0) -> JobEmulation | None:
    """The emulation of `--truth SPEC` over `backend`; None without a truth (emulated GPUs then
    draw the load model's power whatever runs). A truth needs an emulated fleet."""
    if not truth_spec:
        return None
    if not isinstance(backend, EmulatedBackend):
        raise EmulationError("--truth applies to an emulated fleet only: add --emulate FLEET "
                             f"(this node has real GPUs, {backend.name})")
    try:
        truth = parse_truth(truth_spec, seed=seed)
    except ValueError as e:
        raise EmulationError(str(e)) from None
    log.warning("EMULATED GPUs follow the hidden truth %r: jobs are told their pace by %s / %s",
                truth.name, ENV_S_PER_PROMPT, ENV_RUNTIME_S)
    return JobEmulation(truth, backend)
