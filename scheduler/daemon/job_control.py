"""Changing a job's course: cancel it, hold it back from the planner, release it again, as
`scancel` and `scontrol hold/release` do. Each verb is all or nothing over the ids it is
given (a mistyped id changes none of the others), and every refused id is named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection, Row

from scheduler.daemon.access import Access, Caller, RequestError
from scheduler.job_specs import HELD_REASON, OPERATOR_HELD_REASON
from scheduler.jobs.store import (WITHDRAWN_PLAN, hold_kind, hold_pending, hold_values, job_state, release_hold,
                                  request_cancel, set_reason, state_and_hold)
from scheduler.lifecycle import TERMINAL, State, transition
from scheduler.store import Store

log = logging.getLogger(__name__)


class JobControl:
    """cancel, hold and release; the planner is woken after a hold or release (`on_submit`),
    the agents after a cancel (`on_cancel`)."""

    def __init__(self, store: Store, access: Access, *, on_submit: Callable[[], None],
                 on_cancel: Callable[[], None], clock: Callable[[], datetime]) -> None:
        self.store = store
        self.access = access
        self._on_submit = on_submit
        self._on_cancel = on_cancel
        self._clock = clock

    def _rows(self, caller: Caller, job_ids: list[int],
              refuse: Callable[[int, Row], RequestError | None]) -> tuple[list[Row], dict[int, RequestError]]:
        """The rows of `job_ids` (each once) the caller may change, and the refusal of each
        other id: one it may not see, or one `refuse` turns down."""
        rows, refused = [], {}
        with self.store.read() as conn:
            for j in dict.fromkeys(job_ids):
                try:
                    row = self.access.visible_job(conn, caller, j)
                except RequestError as e:
                    refused[j] = e
                    continue
                why = refuse(j, row)
                if why is not None:
                    refused[j] = why
                else:
                    rows.append(row)
        return rows, refused

    def cancel(self, caller: Caller, job_ids: list[int]) -> list[dict]:
        """Cancel jobs, as scancel does: each job the caller may cancel is cancelled (one not
        started yet at once, a running one by asking its agent to stop it: CANCELLING), and
        each other id is answered with why (`{"id", "status", "error"}`) in the same list, in
        the order given. Refused with the first refusal when no id could be cancelled."""
        if not job_ids:
            raise RequestError(400, "give at least one job id to cancel")
        rows, refused = self._rows(caller, job_ids, lambda j, row: RequestError(
            409, f"job {row.id} already ended ({row.state})") if row.state in TERMINAL else None)
        if not rows:
            first = next(iter(refused.values()))
            raise RequestError(first.status, "; ".join(e.message for e in refused.values()))
        now = self._clock()
        done = {r.id: self.store.transact(lambda conn, r=r: _cancel_one(conn, r, caller, now)) for r in rows}
        self._on_cancel()
        return [{"id": j, "state": done[j]} if j in done else
                {"id": j, "status": refused[j].status, "error": refused[j].message}
                for j in dict.fromkeys(job_ids)]

    def hold(self, caller: Caller, job_ids: list[int], *, held: bool) -> list[dict]:
        """Keep jobs from being planned (hold) or let them be planned again (release), like
        `scontrol hold/release`. A PLANNED job that is held goes back to PENDING, its plan
        withdrawn; a running or ended job cannot be held. All or nothing, every refusal named.

        An operator (root, an admin group) holding another user's job places an operator
        hold, as Slurm's admin hold: only an operator releases it, and the owner's release is
        refused. The owner's hold of a job an operator holds leaves it so."""
        verb = "hold" if held else "release"
        admin = self.access.is_admin(caller)
        if not job_ids:
            raise RequestError(400, f"give at least one job id to {verb}")

        def refuse(j: int, row: Row) -> RequestError | None:
            if row.state not in (State.PENDING.value, State.PLANNED.value):
                return RequestError(409, f"job {j} is {row.state}: only a job that has not started "
                                         f"can be {'held' if held else 'released'}")
            if not held and row.hold_kind == "operator" and not admin:
                return RequestError(403, f"job {j} is held by an operator (uid {row.held_by}): "
                                         "only root or an admin_groups member may release it")
            return None

        rows, refused = self._rows(caller, job_ids, refuse)
        if refused:
            first = next(iter(refused.values()))
            raise RequestError(first.status, "; ".join(e.message for e in refused.values()))
        now = self._clock()
        results = []
        for r in rows:
            if held:
                results.append(self.store.transact(lambda conn, r=r: _hold_one(conn, r, caller, admin, now)))
            else:
                results.append(self.store.transact(lambda conn, r=r: _release_one(conn, r, admin)))
        log.info("%s of job(s) %s by uid %s", verb, ", ".join(str(r.id) for r in rows), caller.uid)
        self._on_submit()  # released jobs are plannable now
        return results


def _cancel_one(conn: Connection, r: Row, caller: Caller, now: datetime) -> str:
    """Cancel one job in the caller's transaction: its state after (CANCELLING: its agent
    is asked to stop it)."""
    if transition(conn, r.id, State.CANCELLED, actor_uid=caller.uid,
                  expect=(State.PENDING, State.PLANNED),
                  reason=f"cancelled by uid {caller.uid} before it started",
                  values=dict(ended_at=now)):
        return State.CANCELLED.value
    if request_cancel(conn, r.id, caller.uid, now):
        return "CANCELLING"
    return job_state(conn, r.id)


def _release_one(conn: Connection, r: Row, admin: bool) -> dict:
    """Release one held job; an operator's hold placed since the read stays unless an
    operator releases it."""
    # unless an operator releases it, an operator's hold placed since the read stays
    n = release_hold(conn, r.id, operator_hold_stays=not admin)
    if not n and not admin and hold_kind(conn, r.id) == "operator":
        raise RequestError(403, f"job {r.id} is held by an operator: only root or an "
                                "admin_groups member may release it")
    return {"id": r.id, "held": False, "changed": bool(n)}


def _hold_one(conn: Connection, r: Row, caller: Caller, admin: bool, now: datetime) -> dict:
    """Hold one job: a PLANNED one goes back to PENDING, its plan withdrawn. An operator's
    hold of another user's job is an operator hold; the owner's hold never replaces one."""
    operator = admin and caller.uid != r.owner_uid
    if r.hold_kind == "operator" and not operator:
        # the owner (or an operator on their own job) holding again: the operator's hold stays
        return {"id": r.id, "held": True, "changed": False}
    kind = "operator" if operator else "user"
    values = hold_values(caller.uid, kind, now)
    why = OPERATOR_HELD_REASON if operator else HELD_REASON
    # bumping plan_rev makes a tick planned from before the hold write nothing
    if transition(conn, r.id, State.PENDING, actor_uid=caller.uid, expect=(State.PLANNED,),
                  reason=f"held by {'an operator, ' if operator else ''}uid {caller.uid}: plan withdrawn",
                  values={**values, **WITHDRAWN_PLAN}):
        set_reason(conn, r.id, why)  # queue's REASON
        return {"id": r.id, "held": True, "changed": True}
    # never turn an operator's hold placed since the read into a user's
    if not hold_pending(conn, r.id, values, why, operator_hold_stays=not operator):
        now_row = state_and_hold(conn, r.id)
        if now_row.hold_kind == "operator" and now_row.state == State.PENDING.value:
            return {"id": r.id, "held": True, "changed": False}
        raise RequestError(409, f"job {r.id} is {now_row.state}: it started before it could be held")
    return {"id": r.id, "held": True, "changed": r.held_at is None or r.hold_kind != kind}
