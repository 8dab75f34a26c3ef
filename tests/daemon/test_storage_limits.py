"""Issue 48, finding 4: what one user may store. Every task of an array counts against
`max_queued_per_user`; one request and one user may store only so many bytes (command,
environment, paths: an array multiplies them by its tasks); finished jobs are purged after
`job_retention`, their accounting records kept. On SQLite and PostgreSQL (the `store`
fixture)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select, update

from scheduler.clock import utcnow
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.store.models import job_log_chunks, jobs

ALICE, BOB = Caller(uid=1000, gid=1000), Caller(uid=1001, gid=1001)


def _service(store, tmp_path, **config) -> JobService:
    return JobService(store, ServiceConfig(daemon_uid=0, **config), log_dir=tmp_path / "logs")


def _count(store, uid: int | None = None) -> int:
    with store.read() as conn:
        q = select(func.count()).select_from(jobs)
        if uid is not None:
            q = q.where(jobs.c.owner_uid == uid)
        return conn.execute(q).scalar_one()


def test_every_array_task_counts_against_max_queued_per_user(store, tmp_path):
    service = _service(store, tmp_path, max_queued_per_user=5)
    service.submit(ALICE, {"argv": ["sleep", "1"], "hold": True, "array": "0-3"})  # 4 of 5
    with pytest.raises(RequestError) as e:
        service.submit(ALICE, {"argv": ["sleep", "1"], "hold": True, "array": "0-1"})
    assert e.value.status == 429
    assert "max_queued_per_user" in e.value.message and "limit 5" in e.value.message
    assert "\n" not in e.value.message
    with pytest.raises(RequestError) as e:  # one array larger than the whole allowance
        _service(store, tmp_path, max_queued_per_user=5).submit(BOB, {"argv": ["true"], "array": "0-9"})
    assert e.value.status == 429 and "10" in e.value.message
    assert _count(store, ALICE.uid) == 4 and _count(store, BOB.uid) == 0  # nothing stored when refused
    service.submit(ALICE, {"argv": ["true"]})  # the fifth still fits


def test_one_request_stores_at_most_max_submit_stored_bytes(store, tmp_path):
    # The audit's case, scaled down: one big argument times an array's tasks.
    service = _service(store, tmp_path, max_submit_stored_bytes=256 * 1024)
    big = "x" * 10_000
    service.submit(ALICE, {"argv": ["echo", big], "hold": True, "array": "0-9"})  # ~100 KB: fits
    with pytest.raises(RequestError) as e:
        service.submit(ALICE, {"argv": ["echo", big], "hold": True, "array": "0-99"})  # ~1 MB
    assert e.value.status == 413 and "max_submit_stored_mib" in e.value.message
    assert "\n" not in e.value.message
    with pytest.raises(RequestError) as e:  # the environment counts as well as the command
        service.submit(ALICE, {"argv": ["true"], "env": {f"V{i}": big for i in range(30)}})
    assert e.value.status == 413
    assert _count(store, ALICE.uid) == 10


def test_a_users_stored_bytes_are_capped(store, tmp_path):
    service = _service(store, tmp_path, max_stored_bytes_per_user=100_000)
    big = "y" * 30_000
    for _ in range(3):
        service.submit(ALICE, {"argv": ["echo", big], "hold": True})
    with pytest.raises(RequestError) as e:
        service.submit(ALICE, {"argv": ["echo", big], "hold": True})
    assert e.value.status == 429 and "max_stored_mib_per_user" in e.value.message
    service.submit(BOB, {"argv": ["echo", big], "hold": True})  # bob's own allowance
    assert _count(store, ALICE.uid) == 3
    with store.read() as conn:
        stored = conn.execute(select(jobs.c.stored_bytes).where(jobs.c.owner_uid == ALICE.uid)).scalars().all()
    assert all(30_000 < b < 31_000 for b in stored)


def test_finished_jobs_are_purged_after_the_retention_and_keep_their_accounting(store, tmp_path):
    from scheduler.daemon.retention import purge_finished_jobs

    service = _service(store, tmp_path)
    old = service.submit(ALICE, {"argv": ["echo", "z" * 5000], "env": {"SECRET": "s" * 1000}, "hold": True,
                                 "array": "0-2"})["ids"]
    fresh = service.submit(ALICE, {"argv": ["echo", "fresh"]})["id"]
    waiting = service.submit(ALICE, {"argv": ["echo", "waiting"], "hold": True})["id"]
    now = utcnow()
    long_ago = now - timedelta(days=40)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id.in_(old)).values(
            state="CANCELLED", ended_at=long_ago))
        conn.execute(update(jobs).where(jobs.c.id == old[0]).values(
            state="COMPLETED", started_at=long_ago - timedelta(hours=1), energy_j=3.6e6, gco2=100.0))
        conn.execute(update(jobs).where(jobs.c.id == fresh).values(state="COMPLETED", ended_at=now))
        conn.execute(insert(job_log_chunks), [{"job_id": old[0], "stream": "stdout", "offset": 0, "data": b"x" * 100}])
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{old[0]}.out").write_bytes(b"old output")

    assert purge_finished_jobs(store, retention_s=30 * 86400, log_dir=tmp_path / "logs", now=now) == 3
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(select(jobs).where(jobs.c.owner_uid == ALICE.uid))}
        chunks = conn.execute(select(func.count()).select_from(job_log_chunks)).scalar_one()
    for j in old:
        assert rows[j].purged_at is not None and rows[j].stored_bytes == 0
        assert rows[j].env == {} and "z" * 5000 not in str(rows[j].argv)
    assert rows[old[0]].energy_j == 3.6e6 and rows[old[0]].gco2 == 100.0  # the accounting record stays
    assert rows[old[0]].state == "COMPLETED"
    for j in (fresh, waiting):  # within the retention, or not finished: untouched
        assert rows[j].purged_at is None and rows[j].stored_bytes > 0
    assert chunks == 0 and not (tmp_path / "logs" / f"{old[0]}.out").exists()
    # the purged bytes no longer count against the user
    assert purge_finished_jobs(store, retention_s=30 * 86400, log_dir=tmp_path / "logs", now=now) == 0
