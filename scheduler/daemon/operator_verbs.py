"""What only operators (root, the daemon's user, `admin_groups`) may do besides holding other
users' jobs: drain GPUs and resume them (`drain`/`resume`), and forget learned workload
profiles (`profiles reset`). Each re-plans at once and drops admission's cached inventory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection, select, update

from scheduler.daemon.access import Access, Caller, RequestError
from scheduler.daemon.admission import Admission
from scheduler.store import Store
from scheduler.store.models import gpus

log = logging.getLogger(__name__)


class OperatorVerbs:
    """drain, resume and the reset of learned profiles; the planner is woken after each
    (`on_submit`)."""

    def __init__(self, store: Store, access: Access, admission: Admission, *, on_submit: Callable[[], None],
                 clock: Callable[[], datetime]) -> None:
        self.store = store
        self.access = access
        self.admission = admission
        self._on_submit = on_submit
        self._clock = clock

    def drain(self, caller: Caller, body: object, *, drained: bool) -> dict:
        """Close GPUs to new work (drain) or open them again (resume); root and admins only.

        The target is a node name (all its GPUs), `NODE:INDEX` or a GPU UUID. Running jobs
        finish; jobs planned on drained GPUs are planned elsewhere at the next tick, and an
        agent never starts a job on a drained GPU.
        """
        verb = "drain" if drained else "resume"
        if not self.access.is_admin(caller):
            raise RequestError(403, f"only root or members of admin_groups may {verb} GPUs")
        if not isinstance(body, dict) or not isinstance(body.get("target"), str) or not body["target"].strip():
            raise RequestError(400, f'{verb} body must be {{"target": "NODE" | "NODE:INDEX" | "GPU-UUID"}}')
        target = body["target"].strip()
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
            raise RequestError(400, "reason must be text of at most 500 characters")
        where = _gpu_target(target)
        now = self._clock()
        values = (dict(drained=True, drain_reason=reason, drained_at=now, drained_by=caller.uid) if drained
                  else dict(drained=False, drain_reason=None, drained_at=None, drained_by=None))

        def tx(conn: Connection) -> list:
            hit = list(conn.execute(select(gpus.c.id, gpus.c.node_name, gpus.c.vendor, gpus.c.index, gpus.c.job_id)
                                    .where(where, gpus.c.index >= 0).order_by(gpus.c.vendor, gpus.c.index)))
            vendors = {h.vendor for h in hit}
            if len(vendors) > 1 and target.count(":") == 1 and target.rpartition(":")[2].isdigit():
                names = " and ".join(f"{h.node_name}:{h.vendor}:{h.index}" for h in hit)
                raise RequestError(409, f"{target} is ambiguous on a mixed-vendor node: it names {names}; "
                                        "give NODE:VENDOR:INDEX as `carbonsched nodes` prints it")
            if hit:
                conn.execute(update(gpus).where(gpus.c.id.in_([h.id for h in hit])).values(**values))
            return hit

        hit = self.store.transact(tx)
        if not hit:
            raise RequestError(404, f"no node or GPU {target!r} (give a node name, NODE:VENDOR:INDEX as "
                                    "`carbonsched nodes` prints it, NODE:INDEX or a GPU UUID)")
        log.warning("%s of %d GPU(s) (%s) by uid %s%s", verb, len(hit), target, caller.uid,
                    f": {reason}" if reason else "")
        self.admission.invalidate()
        self._on_submit()  # re-plan now: jobs planned on drained GPUs move, resumed GPUs take work
        return {"target": target, "drained": drained, "reason": reason,
                "gpus": [{"id": h.id, "node": h.node_name, "vendor": h.vendor, "index": h.index,
                          "name": f"{h.node_name}:{h.vendor}:{h.index}", "running_job": h.job_id}
                         for h in hit]}

    def reset_profiles(self, caller: Caller, body: object) -> dict:
        """Forget learned workload profiles (`carbonsched profiles reset`); root and admins only.

        Body: {"workload": W, "model": M}, either or both left out for all. The planner goes
        back to the seed profiles of what is forgotten from its next tick; admission at once.
        """
        if not self.access.is_admin(caller):
            raise RequestError(403, "only an operator (root or a member of admin_groups) may reset learned profiles")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise RequestError(400, 'profiles reset body must be {"workload": W, "model": MODEL} (both optional)')
        for key in ("workload", "model"):
            v = body.get(key)
            if v is not None and (not isinstance(v, str) or not v.strip() or len(v) > 64):
                raise RequestError(400, f"{key} must be a name of at most 64 characters")
        from scheduler.profiles import reset_profiles

        workload, model = body.get("workload"), body.get("model")
        n = self.store.transact(lambda conn: reset_profiles(conn, workload, model))
        log.warning("learned profiles reset by uid %s: %s on %s (%d row(s))", caller.uid, workload or "every workload",
                    model or "every GPU model", n)
        self.admission.invalidate()
        self._on_submit()  # re-plan now with the seeds
        return {"reset": n, "workload": workload, "model": model}


def _gpu_target(target: str):
    """The GPUs a drain/resume target names: a node (all its GPUs), NODE:VENDOR:INDEX (as
    `nodes` prints a GPU: node, then vendor:index), NODE:INDEX (every vendor's GPU of that
    index, refused by the caller when that is more than one vendor) or a GPU UUID."""
    parts = target.split(":")
    if len(parts) >= 3 and parts[-1].isdigit() and parts[-2].isalpha():
        node = ":".join(parts[:-2])
        return (gpus.c.node_name == node) & (gpus.c.vendor == parts[-2]) & (gpus.c.index == int(parts[-1]))
    node, sep, index = target.rpartition(":")
    if sep and index.isdigit():
        return (gpus.c.node_name == node) & (gpus.c.index == int(index))
    return (gpus.c.node_name == target) | (gpus.c.uuid == target)
