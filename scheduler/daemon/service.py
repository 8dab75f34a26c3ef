"""What the API does, independent of HTTP: validate requests, read and change the store.

Every method takes the caller's identity as the kernel reported it (SO_PEERCRED); nothing
in a request body can change who the caller is. A rejected request changes nothing.

`JobService` is the one face the API (and tests, benches) call; each verb is done by the
part that owns it: `Submissions` (submit, `scheduler.daemon.submission`), `JobReading`
(queue, show, logs, nodes, health, `scheduler.daemon.job_reading`), `JobControl` (cancel,
hold, release, `scheduler.daemon.job_control`), `OperatorVerbs` (drain, resume, profiles
reset, `scheduler.daemon.operator_verbs`) and `AccountVerbs` (account, user:
`scheduler.daemon.account_verbs`), sharing one `Access` (who may see what).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from scheduler.clock import utcnow
from scheduler.daemon.access import Access, Caller, ServiceConfig
from scheduler.daemon.account_verbs import AccountVerbs
from scheduler.daemon.admission import Admission
from scheduler.daemon.job_control import JobControl
from scheduler.daemon.job_reading import JobReading
from scheduler.daemon.operator_verbs import OperatorVerbs
from scheduler.daemon.standing_verbs import StandingVerbs
from scheduler.daemon.submission import Submissions
from scheduler.standing import Standing, StandingSettings
from scheduler.store import Store


class JobService:
    """The daemon's verbs over one store. `on_submit` wakes the planner (new or released
    jobs, changed GPUs or profiles), `on_cancel` the local agent (a running job to stop).
    `carbon` (a `scheduler.carbon_signal.CarbonSignal`; None: not asked) gives submit the
    zones' intensity now, to refuse a job alone over its account's CO2 limit."""

    def __init__(self, store: Store, config: ServiceConfig, *, log_dir: Path,
                 on_submit: Callable[[], None] | None = None,
                 on_cancel: Callable[[], None] | None = None, clock: Callable[[], datetime] = utcnow,
                 carbon=None) -> None:
        self.store = store
        self.config = config
        self.log_dir = Path(log_dir)
        on_submit = on_submit or (lambda: None)
        on_cancel = on_cancel or (lambda: None)
        self.access = Access(config)
        self.admission = Admission(store, node_timeout_s=config.node_timeout_s,
                                   default_runtime_s=config.default_runtime_s, clock=clock)
        self.submissions = Submissions(store, config, self.access, self.admission, on_submit=on_submit, clock=clock,
                                       carbon=carbon)
        self.reading = JobReading(store, config, self.access, log_dir=self.log_dir, clock=clock)
        self.control = JobControl(store, self.access, on_submit=on_submit, on_cancel=on_cancel, clock=clock)
        self.operator = OperatorVerbs(store, self.access, self.admission, on_submit=on_submit, clock=clock)
        self.accounts = AccountVerbs(store, self.access, on_change=self._accounts_changed, clock=clock)
        self.standing = StandingVerbs(store, self.access, Standing(
            config.qos, replace(config.standing or StandingSettings(),
                                flexible_grace_pct=config.flexible_grace_pct)), clock=clock)

    def _accounts_changed(self) -> None:
        """Submit's cached associations and limits are stale."""
        self.submissions.tenancy.invalidate()
        self.submissions.budget.invalidate()

    def is_admin(self, caller: Caller) -> bool:
        """Whether the caller is an operator (root, the daemon's user, `admin_groups`)."""
        return self.access.is_admin(caller)

    def submit(self, caller: Caller, body: object) -> dict:
        """`submit` (`Submissions.submit`)."""
        return self.submissions.submit(caller, body)

    def list_jobs(self, caller: Caller, *, include_done: bool = False,
                  states: list[str] | None = None, limit: int | None = None,
                  users: list[str] | None = None, names: list[str] | None = None,
                  since: datetime | None = None, until: datetime | None = None,
                  array_job_id: int | None = None) -> list[dict]:
        """`queue`, `sacct` (`JobReading.list_jobs`)."""
        return self.reading.list_jobs(caller, include_done=include_done, states=states, limit=limit, users=users,
                                      names=names, since=since, until=until, array_job_id=array_job_id)

    def get_job(self, caller: Caller, job_id: int) -> dict:
        """`show` (`JobReading.get_job`)."""
        return self.reading.get_job(caller, job_id)

    def logs(self, caller: Caller, job_id: int, *, stream: str = "stdout",
             tail_bytes: int | None = None, offset: int | None = None) -> dict:
        """`logs` (`JobReading.logs`)."""
        return self.reading.logs(caller, job_id, stream=stream, tail_bytes=tail_bytes, offset=offset)

    def nodes(self, caller: Caller) -> list[dict]:
        """`nodes` (`JobReading.nodes`)."""
        return self.reading.nodes(caller)

    def health(self) -> dict:
        """The daemon's health (`JobReading.health`)."""
        return self.reading.health()

    def cancel(self, caller: Caller, job_ids: list[int]) -> list[dict]:
        """`cancel` (`JobControl.cancel`)."""
        return self.control.cancel(caller, job_ids)

    def hold(self, caller: Caller, job_ids: list[int], *, held: bool) -> list[dict]:
        """`hold` / `release` (`JobControl.hold`)."""
        return self.control.hold(caller, job_ids, held=held)

    def drain(self, caller: Caller, body: object, *, drained: bool) -> dict:
        """`drain` / `resume` (`OperatorVerbs.drain`)."""
        return self.operator.drain(caller, body, drained=drained)

    def reset_profiles(self, caller: Caller, body: object) -> dict:
        """`profiles reset` (`OperatorVerbs.reset_profiles`)."""
        return self.operator.reset_profiles(caller, body)
