"""How a Slurm node's jobs run (`executor = "slurm"`): the agent's launcher when jobs are
handed to Slurm (`SlurmExecutor`). The agent's claim / reconcile / finish loop is the same
as on a plain node (scheduler.node.agent); what Slurm adds is here:

- inventory from Slurm: the node's zone (feature `zone_XX`) and GPUs (GRES types, in
  Slurm's index order; emulated from them where no real GPU is found);
- GPUs follow Slurm: energy is attributed by the GPU indices Slurm gave each job
  (`gres_detail` IDX) over the times Slurm started and ended it; a drained or down node's
  GPUs take no plans;
- adoption of users' held `sbatch` jobs (`scheduler.slurm.adopt`), and observation of GPU
  jobs Slurm runs here outside carbonsched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from types import SimpleNamespace

from sqlalchemy import Connection, update
from sqlalchemy.exc import IntegrityError

from scheduler.clock import utcnow
from scheduler.jobs.job import RunningJob
from scheduler.jobs.store import insert_job, known_slurm_ids, record_slurm_start, running_jobs
from scheduler.lifecycle import State, transition
from scheduler.node.config import AgentConfig
from scheduler.node.executor import LaunchSpec, RunStatus
from scheduler.node.job_ends import parse_time
from scheduler.node.slurm_executor import SlurmExecutor, slurm_time
from scheduler.node.supervise import write_json_atomic
from scheduler.slurm.adopt import adopt_held, follow_adopted, observed_row, slurm_account
from scheduler.slurm.commands import SlurmCommands, SlurmError
from scheduler.slurm.config import SlurmConfig
from scheduler.slurm.inventory import SlurmNodeInfo, read_node
from scheduler.slurm.jobs import comment_for
from scheduler.store import Store
from scheduler.store.models import gpus
from telemetry.gpu import GpuBackend

log = logging.getLogger(__name__)

NODE_REFRESH_S = 10.0
ADOPT_EVERY_S = 2.0
UNAVAILABLE_PREFIX = "slurm: "


class SlurmLauncher:
    """One Slurm node's launcher (scheduler.node.launcher.Launcher). `node_info` is the node
    as Slurm described it at start."""

    def __init__(self, store: Store, backend: GpuBackend, config: AgentConfig, *,
                 slurm: SlurmCommands, slurm_config: SlurmConfig, node_info: SlurmNodeInfo,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.backend = backend
        self.node = config.node
        self.slurm = slurm
        self.slurm_config = slurm_config
        self.node_info = node_info
        self._clock = clock
        self.slurm_executor = SlurmExecutor(config.state_dir, slurm, grace_s=config.grace_s)
        self.executor = self.slurm_executor
        self.devices: list = []
        self._uuid_of: dict[int, str] = {}
        self._slurm_gpu_of_id: dict[int, int] = {}   # store GPU id -> Slurm GRES index
        self._id_of_slurm_gpu: dict[int, int] = {}
        self._synced: set[int] = set()
        self._busy_idx: set[int] = set()
        self._node_checked = -1e18
        self._adopted_at = -1e18
        self._refused: set[int] = set()
        self._observed: set[int] = set()  # Slurm job ids already looked at

    def registered(self, devices: list, uuid_of: dict[int, str], gpu_of: dict[str, int]) -> None:
        """Match the backend's devices to Slurm's GRES indices by order (gres.conf lists a
        node's GPUs in the order its driver numbers them)."""
        self.devices = devices
        self._uuid_of = uuid_of
        if len(devices) != len(self.node_info.gpus):
            log.error("node %s: the GPU backend sees %d GPUs, Slurm's GRES has %d; energy is "
                      "attributed to the first %d by index", self.node, len(devices),
                      len(self.node_info.gpus), min(len(devices), len(self.node_info.gpus)))
        self._slurm_gpu_of_id = {}
        for idx, device in enumerate(devices[:len(self.node_info.gpus)]):
            gid = gpu_of.get(device.uuid)
            if gid is not None:
                self._slurm_gpu_of_id[gid] = idx
        self._id_of_slurm_gpu = {idx: gid for gid, idx in self._slurm_gpu_of_id.items()}

    def refresh(self) -> bool:
        """Read Slurm's jobs once per tick. When Slurm cannot be read, jobs wait (nothing is
        claimed or ended blind); the node still heartbeats, so a Slurm outage does not make
        carbonsched declare its running jobs lost."""
        try:
            self.slurm_executor.refresh()
        except SlurmError as e:
            log.error("node %s: cannot read Slurm's jobs, claiming and reconciling nothing: %s", self.node, e)
            return False
        return True

    def follow(self) -> bool:
        """After the agent's tick: follow what Slurm did, the node's state, and users' jobs
        to adopt or observe."""
        try:
            changed = self._follow_slurm()
            changed |= self._check_node()
            changed |= self._adopt()
            changed |= self._observe()
            return changed
        except SlurmError as e:
            log.error("node %s: %s", self.node, e)
            return False
    # -- handing jobs to Slurm ----------------------------------------------------------

    def launch_spec(self, job, spec: LaunchSpec) -> LaunchSpec:
        """The agent's spec, with the Slurm job to submit: the planned GPUs' GRES type and
        count on this node, to begin at the planned start, charged to the job's account and
        QOS (as `SlurmConfig.sbatch_account`/`sbatch_qos` name them for Slurm)."""
        ids = list(job.planned_gpu_ids or [])
        types = {self.node_info.gpus[self._slurm_gpu_of_id[g]].gres_type for g in ids
                 if g in self._slurm_gpu_of_id}
        if len(types) != 1:
            raise OSError(f"job {job.id}: planned GPUs {ids} are not one Slurm GRES type ({types})")
        # One Slurm job per attempt and per segment of an interruptible job (a resume is not
        # an attempt), so a resumed segment is never mistaken for its checkpointed predecessor.
        attempt = int(job.attempts or 0) + 1 + int(getattr(job, "resume_count", 0) or 0)
        slurm = dict(partition=self.slurm_config.submit_partition, node=self.node,
                     gres_type=types.pop(), count=len(ids),
                     begin=slurm_time(job.planned_start), comment=comment_for(job.id, attempt),
                     name=job.name, adopted_job_id=job.slurm_job_id,
                     not_before=job.submitted_at.timestamp(),
                     account=self.slurm_config.sbatch_account(job.account),
                     qos=self.slurm_config.sbatch_qos(job.qos))
        return replace(spec, extra={**spec.extra, "slurm": slurm})

    def claim_ended(self, job_id: int) -> None:
        """A new claim: its real start and GPUs are recorded again once Slurm runs it."""
        self._synced.discard(job_id)

    # -- following Slurm ----------------------------------------------------------------

    def set_busy(self, uuid: str, busy: bool) -> None:
        """GPU load follows Slurm's allocation (see `_follow_slurm`), not carbonsched's claims."""

    def _follow_slurm(self) -> bool:
        """Load the GPUs Slurm allocated (the emulator's power follows them) and record each
        carbonsched job's real start and GPUs once Slurm runs it."""
        busy: set[int] = set()
        for sj in self.slurm_executor.jobs().values():
            if sj.state in ("RUNNING", "COMPLETING") and sj.nodes == self.node:
                busy.update(sj.gpu_idx)
        for idx in busy ^ self._busy_idx:
            gid = self._id_of_slurm_gpu.get(idx)
            uuid = self._uuid_of.get(gid) if gid is not None else None
            if uuid:
                self.backend.set_busy(uuid, idx in busy)
        self._busy_idx = busy
        for job in running_jobs(self.store, self.node):
            if job.id in self._synced:
                continue
            idx, started = self.slurm_executor.running_gpus(job.id)
            if not idx or started is None:
                continue
            self._record_start(job, idx, started)
            self._synced.add(job.id)
        return False

    def _record_start(self, job: RunningJob, idx: list[int], started: datetime) -> None:
        new_ids = [self._id_of_slurm_gpu[i] for i in idx if i in self._id_of_slurm_gpu]
        old_ids = [int(g) for g in job.gpu_ids or []]
        indices = [self._index_of(g) for g in new_ids]

        slurm_id = self.slurm_executor.slurm_job_id(job.id)
        reason = f"running as Slurm job {slurm_id} on {self.node} GPUs {','.join(map(str, idx))}"

        def tx(conn: Connection) -> None:
            record_slurm_start(conn, job.id, started, new_ids, indices, reason)
            if set(new_ids) != set(old_ids):
                conn.execute(update(gpus).where(gpus.c.job_id == job.id).values(job_id=None))
                conn.execute(update(gpus).where(gpus.c.id.in_(new_ids), gpus.c.job_id.is_(None))
                             .values(job_id=job.id))

        self.store.transact(tx)
        if set(new_ids) != set(old_ids):
            log.info("job %s: Slurm runs it on GPUs %s (planned %s)", job.id, idx,
                     [self._slurm_gpu_of_id.get(g) for g in old_ids])

    def _index_of(self, gid: int) -> int | None:
        uuid = self._uuid_of.get(gid)
        for d in self.devices:
            if d.uuid == uuid:
                return d.index
        return None

    def measured_run(self, job, status: RunStatus):
        """The run as Slurm timed it, on the GPUs Slurm gave the job."""
        result = status.result or {}
        started = parse_time(result.get("started_at"))
        if started is None:  # cancelled before Slurm started it: it used no GPU
            return None
        idx = result.get("gpu_idx") or []
        ids = [self._id_of_slurm_gpu[i] for i in idx if i in self._id_of_slurm_gpu] or list(job.gpu_ids or [])
        return SimpleNamespace(id=job.id, gpu_ids=ids, started_at=started)

    def launched_anyway(self, job: RunningJob) -> bool:
        """A job with a Slurm job of its own (adopted, observed) was launched even when this
        agent died before writing that down: note the id instead of re-queueing it."""
        sj = self.slurm_executor.jobs().get(job.slurm_job_id) if job.slurm_job_id is not None else None
        if sj is not None and not sj.held:  # released (or observed running): it is Slurm's now
            run_dir = self.slurm_executor.run_dir(job.id)
            run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_json_atomic(run_dir / "slurm.json", {"job_id": job.slurm_job_id})
            log.warning("job %s: found its Slurm job %s again after a restart", job.id, job.slurm_job_id)
            return True
        return False

    def forget_orphans(self, running_here: set[int]) -> None:
        """A job carbonsched only observed is never stopped for being no longer RUNNING here
        (declared lost while this agent was away): it is Slurm's and its owner's, not
        carbonsched's, to stop."""
        for job_id in self.executor.known_runs():
            if job_id not in running_here and self.slurm_executor.observed(job_id):
                self.executor.forget(job_id)

    def _observe(self) -> bool:
        """Make carbonsched jobs of Slurm GPU jobs running here that carbonsched does not know
        (submitted with plain sbatch elsewhere than a carbon-aware partition, or unheld): their
        GPUs are busy for the planner, and they get receipts when they end."""
        if not self.slurm_config.observe:
            return False
        seen = [sj for sj in self.slurm_executor.jobs().values()
                if sj.state == "RUNNING" and sj.nodes == self.node and sj.gpu_idx
                and sj.carbonsched_id is None and sj.job_id not in self._observed]
        if not seen:
            return False
        with self.store.read() as conn:
            known = known_slurm_ids(conn, [sj.job_id for sj in seen])
        changed = False
        for sj in seen:
            self._observed.add(sj.job_id)
            if sj.job_id in known:
                continue
            ids = [self._id_of_slurm_gpu[i] for i in sj.gpu_idx if i in self._id_of_slurm_gpu]
            if not ids:
                continue
            job_id = self._insert_observed(sj, ids)
            if job_id is not None:
                changed = True
        return changed

    def _insert_observed(self, sj, ids: list[int]) -> int | None:
        now = self._clock()
        row = observed_row(sj, now)
        started = sj.start_time or now
        node = self.node

        def tx(conn: Connection) -> int:
            job_id = insert_job(conn, {**row, "account": slurm_account(conn, sj, row["owner_name"])},
                                row["owner_uid"], now)
            why = f"observed running in Slurm (job {sj.job_id})"
            transition(conn, job_id, State.PLANNED, actor_uid=None, reason=why, expect=State.PENDING,
                       values=dict(planned_node=node, planned_gpu_ids=ids, planned_start=started))
            transition(conn, job_id, State.RUNNING, actor_uid=None, reason=why, expect=State.PLANNED,
                       values=dict(node=node, gpu_ids=ids, gpu_indices=[self._index_of(g) for g in ids],
                                   started_at=started, attempts=1))
            conn.execute(update(gpus).where(gpus.c.id.in_(ids), gpus.c.job_id.is_(None)).values(job_id=job_id))
            return job_id

        try:
            job_id = self.store.transact(tx)
        except IntegrityError:
            return None  # another agent observed it first
        run_dir = self.slurm_executor.run_dir(job_id)
        run_dir.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(run_dir / "slurm.json", {"job_id": sj.job_id, "gpu_idx": list(sj.gpu_idx),
                                                   "observed": True})
        self._synced.add(job_id)
        log.info("Slurm job %s (%s, uid %s) runs on %s GPUs %s outside carbonsched: observed as job %s",
                 sj.job_id, sj.name, sj.user_id, node, list(sj.gpu_idx), job_id)
        return job_id

    def _check_node(self) -> bool:
        """Every NODE_REFRESH_S: a node Slurm drained or lost takes no plans (its GPUs show
        unhealthy with Slurm's reason); back in service, they take plans again."""
        now = time.monotonic()
        if now - self._node_checked < NODE_REFRESH_S:
            return False
        self._node_checked = now
        info = read_node(self.slurm, self.slurm_config, self.node)
        why = info.unavailable
        node = self.node

        def tx(conn: Connection) -> int:
            if why:
                return conn.execute(update(gpus).where(gpus.c.node_name == node, gpus.c.healthy.is_(True))
                                    .values(healthy=False, unhealthy_reason=UNAVAILABLE_PREFIX + why)).rowcount
            return conn.execute(update(gpus).where(gpus.c.node_name == node,
                                                   gpus.c.unhealthy_reason.like(UNAVAILABLE_PREFIX + "%"))
                                .values(healthy=True, unhealthy_reason=None)).rowcount

        changed = self.store.transact(tx) > 0
        if changed:
            log.warning("node %s: %s", node, f"Slurm runs nothing here ({why})" if why else "back in service")
        return changed

    def _adopt(self) -> bool:
        if not self.slurm_config.adopt:
            return False
        now = time.monotonic()
        if now - self._adopted_at < ADOPT_EVERY_S:
            return False
        self._adopted_at = now
        slurm_jobs = list(self.slurm_executor.jobs().values())
        new = adopt_held(self.store, slurm_jobs, self.slurm_config, self._clock(), refused=self._refused)
        return bool(new) | (follow_adopted(self.store, self.slurm, slurm_jobs) > 0)
