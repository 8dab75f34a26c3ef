"""The `slurm` executor backend: "run this job on these GPUs" becomes a Slurm job.

It has the local executor's interface (`launch`, `status`, `signal_cancel`, `forget`,
`known_runs`, ...), so the agent's claim / reconcile / finish logic is the same for both.
Where the local backend keeps a supervisor's lock and result in the run directory, this one
keeps the Slurm job id (`slurm.json`) and asks slurmctld how the job is doing:

- launch: `sbatch` as the job's owner (`--nodelist`, `--gres=gpu:TYPE:K`, `--begin` at the
  planned start, `--time`, output paths, `--comment=carbonsched:ID`), or, for a job adopted
  from a user's held `sbatch`, `scontrol update` (node, GRES, StartTime) and `scontrol
  release`. Before submitting it looks the comment up, so a crash between plan and sbatch
  never submits twice.
- status: Slurm's state mapped to the local backend's run states (see `_status_of`).
- cancel: `scancel`. A cancel from Slurm's side shows up as CANCELLED too.

carbonsched going down never stops a Slurm job; a restarted agent finds its jobs again
from the run directories and, failing those, from the comments.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from scheduler import interruptible
from scheduler.node import job_metrics
from scheduler.node.segment_clock import create_request_file, remove_request_file
from scheduler.node.executor import Executor, LaunchSpec, RunState, RunStatus, _read_json
from scheduler.node.supervise import open_job_log, write_json_atomic
from scheduler.slurm.commands import Identity, SlurmCommands, SlurmError
from scheduler.slurm.jobs import LOST_STATES, SlurmJob, list_jobs

log = logging.getLogger(__name__)

# Set by Slurm from the job's GRES; a value carried over from carbonsched would be wrong.
SLURM_SETS = frozenset({"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                        "CUDA_DEVICE_ORDER", "GPU_DEVICE_ORDINAL"})
SNAPSHOT_MAX_AGE_S = 0.5
# A checkpoint signal Slurm could not deliver (no batch step yet) is sent again this much later,
# once the batch shell has had time to set it aside (`keep_timetable`).
SIGNAL_RETRY_S = 2.0
# A checkpoint job with a request file gets the file first and its signal this much later:
# a job that watches the file has checkpointed by then, and the signal cannot reach a batch
# shell that has not yet set it aside (`trap ''`; on a loaded node that can take seconds).
SIGNAL_AFTER_FILE_S = 2.0


# What sbatch says when the job's own request cannot be met (Slurm's slurm_errno texts):
# asking again could only be refused again. Anything else (slurmctld down, a timeout) is
# worth another try at the next tick.
REQUEST_REFUSALS = ("Invalid account", "Invalid qos", "accounting/QOS policy",
                    "Requested time limit is invalid", "Invalid wckey")


def refusal(message: str) -> str | None:
    """Slurm's words when `message` (a failed sbatch) refuses the job's own request, else None."""
    if not any(r in message for r in REQUEST_REFUSALS):
        return None
    _, sep, tail = message.rpartition("submission failed: ")
    return (tail if sep else message).strip()


def gres(s: dict) -> str:
    """The GPU GRES request of a hand-off: 'gpu:h100:2', or 'gpu:2' on untyped GRES."""
    return f"gpu:{s['gres_type']}:{s['count']}" if s["gres_type"] else f"gpu:{s['count']}"


def slurm_time(t: datetime) -> str:
    """A time as Slurm's tools read it: wall-clock time, no zone, in the tools' fixed TZ
    (UTC: `scheduler.slurm.commands.tool_env`), whatever the agent's or a job's TZ."""
    return t.astimezone(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")


class SlurmExecutor(Executor):
    """Runs jobs as Slurm jobs; one instance per agent (node)."""

    def __init__(self, state_dir: Path, slurm: SlurmCommands, *, grace_s: float = 10.0) -> None:
        super().__init__(state_dir, grace_s=grace_s)
        self.slurm = slurm
        self._snapshot: dict[int, SlurmJob] = {}
        self._by_comment: dict[str, list[SlurmJob]] = {}
        self._snapshot_at = -math.inf
        # Slurm job id -> when this process submitted (or released) it: a job newer than the
        # latest squeue is known to be there without asking again.
        self._launched_at: dict[int, float] = {}

    # -- what slurmctld knows -------------------------------------------------------------

    def refresh(self) -> dict[int, SlurmJob]:
        """Read every job slurmctld remembers (one `squeue --json`)."""
        jobs = list_jobs(self.slurm)
        self._snapshot = {j.job_id: j for j in jobs}
        self._by_comment = {}
        for j in sorted(jobs, key=lambda j: j.job_id, reverse=True):
            if j.carbonsched_id is not None:
                self._by_comment.setdefault(j.comment, []).append(j)
        self._snapshot_at = time.monotonic()
        return self._snapshot

    def jobs(self, max_age_s: float = SNAPSHOT_MAX_AGE_S) -> dict[int, SlurmJob]:
        """Slurm's jobs, read again when the last read is older than `max_age_s`."""
        if time.monotonic() - self._snapshot_at > max_age_s:
            self.refresh()
        return self._snapshot

    def find(self, comment: str, not_before: float | None = None, *, uid: int,
             fresh: bool = False) -> SlurmJob | None:
        """The Slurm job with this carbonsched comment (the newest, should there be two),
        submitted by `uid` (the user carbonsched submits as) no earlier than `not_before`
        (epoch s). Anyone can write any comment: a job of another user with this comment is a
        forgery, never this job. One submitted before the carbonsched job existed belongs to
        another store's job of the same id (a database restored or replaced)."""
        self.jobs(0.0 if fresh else SNAPSHOT_MAX_AGE_S)
        for job in self._by_comment.get(comment, []):
            if job.user_id != uid:
                continue
            # Slurm's submit times are whole seconds.
            if not_before is None or job.submit_time is None or job.submit_time.timestamp() >= math.floor(not_before):
                return job
        return None

    @staticmethod
    def submitter_uid(job_uid: int) -> int:
        """Whose Slurm job a carbonsched job becomes: its owner's when this agent is root (it
        submits as them), this agent's own otherwise."""
        return job_uid if os.geteuid() == 0 else os.geteuid()

    def observed(self, job_id: int) -> bool:
        """Whether this run is a Slurm job carbonsched only observes (not submitted or placed)."""
        return bool((_read_json(self.run_dir(job_id) / "slurm.json") or {}).get("observed"))

    def slurm_job_id(self, job_id: int) -> int | None:
        rec = _read_json(self.run_dir(job_id) / "slurm.json")
        return int(rec["job_id"]) if rec else None

    # -- the executor interface -----------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> None:
        """Hand the job to Slurm (or place and release an adopted one). Raises OSError when
        Slurm refused: nothing was submitted then, and the agent re-queues the job."""
        run_dir = self.run_dir(spec.job_id)
        run_dir.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(run_dir / "spec.json", _spec_dict(spec))
        s = spec.extra["slurm"]
        try:
            # The squeue this tick began with is fresh enough: any sbatch an earlier agent made
            # finished before this process started, and this one records each before the next.
            existing = None if s.get("adopted_job_id") else self.find(
                s["comment"], s.get("not_before"), uid=self.submitter_uid(spec.uid))
            if existing is not None:
                slurm_id = existing.job_id
                log.warning("job %s: Slurm already has it as job %s (%s); not submitting again",
                            spec.job_id, slurm_id, s["comment"])
            elif s.get("adopted_job_id"):
                slurm_id = int(s["adopted_job_id"])
                self._place_adopted(slurm_id, s)
            else:
                slurm_id = self._sbatch(spec, s)
        except SlurmError as e:
            why = refusal(str(e))
            if why is not None:
                write_json_atomic(run_dir / "refused.json", {"why": why})
            raise OSError(f"Slurm: {e}") from e
        write_json_atomic(run_dir / "slurm.json", {"job_id": slurm_id})
        self._launched_at[slurm_id] = time.monotonic()
        log.info("job %s is Slurm job %s on %s (gpu:%s:%s, begin %s)", spec.job_id, slurm_id,
                 s["node"], s["gres_type"], s["count"], s["begin"])

    def _sbatch(self, spec: LaunchSpec, s: dict) -> int:
        owner = Identity(spec.uid, spec.gid, tuple(spec.groups))
        for path in (spec.stdout, spec.stderr):
            _create_owned(Path(path), spec.uid, spec.gid)
        if spec.metrics_file:
            job_metrics.create(Path(spec.metrics_file), spec.uid, spec.gid)
        remove_request_file((spec.extra or {}).get("checkpoint_file"))  # this segment starts unasked
        argv = ["sbatch", "--parsable", f"--partition={s['partition']}", f"--nodelist={s['node']}",
                f"--gres={gres(s)}", f"--begin={s['begin']}",
                f"--comment={s['comment']}", f"--job-name={s['name']}",
                f"--output={spec.stdout}", f"--error={spec.stderr}", "--open-mode=append",
                f"--chdir={spec.cwd}", "--export=ALL", "--nodes=1", "--ntasks=1"]
        # --export=ALL with the job's env as sbatch's --export-file (SlurmCommands.run): the
        # job gets exactly its own environment, and sbatch parses none of it.
        if spec.time_limit_s:
            argv.append(f"--time={max(1, math.ceil(spec.time_limit_s / 60))}")
        if s.get("account"):
            argv.append(f"--account={s['account']}")
        if s.get("qos"):
            argv.append(f"--qos={s['qos']}")
        command = shlex.join(spec.argv)
        ignored = interruptible.startup_ignored_signal(spec.extra)
        if ignored is not None:
            # The batch script becomes the job itself: `scancel --signal --batch` reaches it
            # (a shell in between would die of the signal and end the job unsaved). It starts
            # with the signal ignored, as under the local supervisor: a request while the
            # batch step is still starting cannot kill it (the request file is there too).
            command = f"trap '' {signal.Signals(ignored).name.removeprefix('SIG')}; exec {command}"
        argv += ["--wrap", command]
        env = {k: v for k, v in spec.env.items() if k not in SLURM_SETS}
        env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
        out = self.slurm.run(argv, as_user=owner, job_env=env).stdout.strip()
        try:
            return int(out.split(";")[0])
        except ValueError:
            raise SlurmError(f"sbatch printed no job id: {out!r}") from None

    def keep_timetable(self, job_id: int) -> None:
        """A checkpoint job's request at the planned end of its segment (issue 30), kept by the
        agent here (Slurm runs no supervisor of ours): at `checkpoint_at` the request file is
        created and, SIGNAL_AFTER_FILE_S later, the job's batch process gets its checkpoint
        signal (`scancel --signal --batch`); one still running `checkpoint_grace_s` after the
        signal is `scancel`led and counted as
        having ignored it. Recorded in RUN_DIR/checkpoint.json, so a restarted agent neither
        asks twice nor forgets to kill. The job exits 75 and is re-planned like any other
        (a new Slurm job for its next segment)."""
        run_dir = self.run_dir(job_id)
        spec = _read_json(run_dir / "spec.json") or {}
        extra = spec.get("extra") or {}
        if extra.get("interruptible") != "checkpoint" or not extra.get("checkpoint_at"):
            return
        slurm_id = self.slurm_job_id(job_id)
        job = self.jobs().get(slurm_id) if slurm_id is not None else None
        if job is None or job.state != "RUNNING":
            return
        rec = _read_json(run_dir / "checkpoint.json") or {}
        now = time.time()
        if not rec.get("requested_at"):
            started = job.start_time.timestamp() if job.start_time else now
            if now < interruptible.checkpoint_request_at_s(
                    datetime.fromisoformat(extra["checkpoint_at"]).timestamp(), started, extra.get("min_run_s")):
                return
            if now < float(rec.get("signal_retry_at") or 0.0):
                return
            if extra.get("checkpoint_file"):
                if not rec.get("file_at"):
                    create_request_file(extra["checkpoint_file"], int(spec["uid"]), int(spec["gid"]))
                    rec = {"file_at": now}
                    write_json_atomic(run_dir / "checkpoint.json", rec)
                if now < float(rec["file_at"]) + SIGNAL_AFTER_FILE_S:
                    return
            name = signal.Signals(interruptible.launch_signal(extra)).name.removeprefix("SIG")
            try:
                self.slurm.run(["scancel", f"--signal={name}", "--batch", str(slurm_id)])
            except SlurmError:
                # No batch step yet (Slurm says RUNNING before its batch shell runs): asking
                # again at the next tick would reach the shell as it starts, before it has set
                # the signal aside (`trap ''`), and end the job unsaved. The request file is
                # there already; the signal follows SIGNAL_RETRY_S later.
                write_json_atomic(run_dir / "checkpoint.json", {**rec, "signal_retry_at": now + SIGNAL_RETRY_S})
                raise
            write_json_atomic(run_dir / "checkpoint.json", {**rec, "requested_at": now})
            log.info("job %s: asked Slurm job %s to checkpoint (SIG%s)", job_id, slurm_id, name)
        elif not rec.get("killed") and now - float(rec["requested_at"]) >= float(extra.get("checkpoint_grace_s") or 60):
            write_json_atomic(run_dir / "checkpoint.json", {**rec, "killed": True})
            self.slurm.run(["scancel", str(slurm_id)])
            self._snapshot_at = -math.inf
            log.warning("job %s: Slurm job %s ignored its checkpoint request; cancelled", job_id, slurm_id)

    def _place_adopted(self, slurm_id: int, s: dict) -> None:
        """Put a held user job where and when carbonsched planned it, then release it."""
        self.slurm.run(["scontrol", "update", f"JobId={slurm_id}", f"NodeList={s['node']}",
                        f"TresPerNode=gres/{gres(s)}", f"StartTime={s['begin']}"])
        self.slurm.run(["scontrol", "release", str(slurm_id)])

    def status(self, job_id: int) -> RunStatus:
        run_dir = self.run_dir(job_id)
        spec = _read_json(run_dir / "spec.json")
        slurm_id = self.slurm_job_id(job_id)
        if slurm_id is None:
            s = ((spec or {}).get("extra") or {}).get("slurm", {})
            found = (self.find(s["comment"], s.get("not_before"), uid=self.submitter_uid(int(spec["uid"])))
                     if s.get("comment") and "uid" in spec else None)
            if found is None:
                refused = _read_json(run_dir / "refused.json")
                if refused:
                    return RunStatus(RunState.REFUSED, spec=spec, note=f"Slurm refused the job: {refused['why']}")
                return RunStatus(RunState.NOT_LAUNCHED, spec=spec)
            slurm_id = found.job_id  # submitted, then the agent died before writing it down
            write_json_atomic(run_dir / "slurm.json", {"job_id": slurm_id})
        job = self.jobs().get(slurm_id)
        if job is None and self._launched_at.get(slurm_id, -math.inf) >= self._snapshot_at:
            return RunStatus(RunState.RUNNING, spec=spec)  # submitted after the last squeue
        if job is None:
            job = self.refresh().get(slurm_id)
        if job is None:
            return RunStatus(RunState.VANISHED, spec=spec,
                             note=f"Slurm has no record of job {slurm_id} any more (ended longer "
                                  "than MinJobAge ago while carbonsched was away?)")
        if job.active:
            if job.state == "RUNNING" and job.gpu_idx:
                self._note_gpus(run_dir, slurm_id, job)
            return RunStatus(RunState.RUNNING, spec=spec)
        status = _status_of(job, spec, cancelled_here=(run_dir / "cancel.json").exists(),
                            gpu_idx=self._noted_gpus(run_dir))
        ck = _read_json(run_dir / "checkpoint.json")
        if ck and ck.get("requested_at") and status.result is not None:  # a checkpoint job's segment end
            status.result["checkpoint_requested_at"] = datetime.fromtimestamp(
                float(ck["requested_at"]), timezone.utc).isoformat()
            if ck.get("killed") and status.result.get("exit_code") != 75:
                status.result.pop("cancelled_outside", None)
                status.result["checkpoint_killed"] = True
        return status

    def _note_gpus(self, run_dir: Path, slurm_id: int, job: SlurmJob) -> None:
        rec = _read_json(run_dir / "slurm.json") or {}
        if rec.get("gpu_idx") != list(job.gpu_idx):
            write_json_atomic(run_dir / "slurm.json", {"job_id": slurm_id, "gpu_idx": list(job.gpu_idx),
                                                       "started_at": job.start_time.isoformat()
                                                       if job.start_time else None})

    def _noted_gpus(self, run_dir: Path) -> list[int] | None:
        rec = _read_json(run_dir / "slurm.json") or {}
        return rec.get("gpu_idx")

    def running_gpus(self, job_id: int) -> tuple[list[int] | None, datetime | None]:
        """Slurm's GPU indices and start time of a job it runs (None until it starts)."""
        slurm_id = self.slurm_job_id(job_id)
        job = self.jobs().get(slurm_id) if slurm_id is not None else None
        if job is None or job.state not in ("RUNNING", "COMPLETING") and job.active:
            return None, None
        return (list(job.gpu_idx) or self._noted_gpus(self.run_dir(job_id))), job.start_time

    def signal_cancel(self, job_id: int) -> bool:
        """`scancel` the job's Slurm job (noted, so its end reads as cancelled by carbonsched)."""
        slurm_id = self.slurm_job_id(job_id)
        if slurm_id is None:
            return False
        write_json_atomic(self.run_dir(job_id) / "cancel.json", {"at": time.time()})
        try:
            self.slurm.run(["scancel", str(slurm_id)])
        except SlurmError as e:
            log.error("job %s: scancel %s failed: %s", job_id, slurm_id, e)
            return False
        self._snapshot_at = -math.inf
        # Slurm job id -> when this process submitted (or released) it: a job newer than the
        # latest squeue is known to be there without asking again.
        self._launched_at: dict[int, float] = {}
        return True


def _status_of(job: SlurmJob, spec: dict | None, *, cancelled_here: bool,
               gpu_idx: list[int] | None) -> RunStatus:
    """An ended Slurm job as the agent reads a finished run.

    COMPLETED/FAILED -> the exit code (and signal); CANCELLED -> cancelled (by carbonsched's
    scancel) or cancelled from Slurm's side; TIMEOUT -> timed out; NODE_FAIL, BOOT_FAIL,
    PREEMPTED -> vanished (LOST, or re-queued while retries last); the rest -> failed with
    Slurm's state as the error.
    """
    result: dict = {"exit_code": job.exit_code, "slurm_job_id": job.job_id, "slurm_state": job.state,
                    "ended_at": (job.end_time or job.start_time).isoformat() if (job.end_time or job.start_time) else None,
                    "started_at": job.start_time.isoformat() if job.start_time else None,
                    "gpu_idx": list(job.gpu_idx) or gpu_idx}
    state = job.state
    if state in LOST_STATES:
        return RunStatus(RunState.VANISHED, spec=spec, note=f"Slurm job {job.job_id} ended {state}"
                         + (f" ({job.reason})" if job.reason and job.reason != "None" else ""))
    if state == "CANCELLED":
        if cancelled_here:
            result["cancelled"] = True
        else:
            result["cancelled_outside"] = f"cancelled in Slurm (scancel of job {job.job_id})"
        # Cancelled while pending, Slurm reports start = end; seen running (GPUs noted), it ran.
        if job.start_time is None or (not result["gpu_idx"] and job.end_time and job.start_time >= job.end_time):
            result["started_at"] = None
    elif state == "TIMEOUT":
        result["timed_out"] = True
    elif state in ("COMPLETED", "FAILED"):
        if job.signal:
            result["signal"] = job.signal
            result["exit_code"] = None if job.exit_code == 0 else job.exit_code
    else:
        result["error"] = f"Slurm job {job.job_id} ended {state}"
    return RunStatus(RunState.FINISHED, result, spec)


def _spec_dict(spec: LaunchSpec) -> dict:
    return asdict(spec)


def _create_owned(path: Path, uid: int, gid: int) -> None:
    """Create a log file for the job's owner (slurmd opens it as them); another user's file
    there is replaced, never handed over (`open_job_log`)."""
    os.close(open_job_log(str(path), uid, gid))
