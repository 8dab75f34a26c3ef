"""Where a queued job stands in the daemon's planner tick (SQLite and PostgreSQL): its QOS
bounds what carbon may do with it, and fair share orders the accounts under contention.

- Under the default QOS (`normal`) a few seconds' job with idle GPUs starts at once: no wait
  can save the grams it is worth waiting for; a job of hours that gives its own deadline is
  still moved to cleaner hours.
- An `urgent` job is never held for carbon while fitting GPUs are free.
- With one GPU and two accounts of equal shares, the job of the account that has used its
  share goes after the job of the one that has not, whatever their submit order.
- A job charged to an account that is gone plans after the others; the tick never fails.
- REASON says whose work a job waits behind, in Slurm's words and naming no other job:
  `Priority` behind jobs of a higher priority, `Resources` behind running jobs or jobs of its
  own priority; an urgent job on a free GPU and a job waiting for carbon by choice say neither.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from scheduler.accounts import add_account, add_user
from scheduler.daemon.planner import Planner
from scheduler.daemon.policy_factory import make_policy
from scheduler.qos import QosTable
from scheduler.standing import Standing
from scheduler.store.models import jobs

from tests.daemon.test_planner_carbon import DE, T, add_node, import_carbon, job_row, service, submit  # noqa: F401

SLOT = timedelta(minutes=15)


def planner_with_standing(store, policy: str = "greedy") -> Planner:
    return Planner(store, make_policy(policy, plan_interval_s=15.0), clock=lambda: T, plan_interval_s=15.0,
                   standing=Standing(QosTable()))


def planned_start(store, job_id):
    return job_row(store, job_id).planned_start


def test_a_few_seconds_job_on_idle_gpus_starts_within_a_tick_under_the_default_qos(store, service):
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    short = submit(service, est_runtime_s=5.0, deadline=(T + timedelta(hours=20)).isoformat())
    long = submit(service, est_runtime_s=4 * 3600.0, deadline=(T + timedelta(hours=30)).isoformat())
    planner_with_standing(store).tick()
    assert planned_start(store, short) - T < SLOT
    # the four-hour job with its own deadline is still worth moving to DE's cleaner night
    assert planned_start(store, long) - T > timedelta(hours=2)
    assert job_row(store, short).qos == "normal"  # the default QOS, nothing asked


def test_the_same_short_job_waits_for_carbon_without_qos_rules(store, service):
    """What the default QOS changes: without it the planner holds the 5 s job for cleaner
    hours to save a fraction of a gram."""
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    short = submit(service, est_runtime_s=5.0, deadline=(T + timedelta(hours=20)).isoformat())
    Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=lambda: T, plan_interval_s=15.0).tick()
    assert planned_start(store, short) - T > SLOT


def test_an_urgent_job_is_never_held_for_carbon_while_gpus_are_free(store, service):
    import_carbon(store, DE)
    add_node(store, "de1", "DE", n=2)
    urgent = submit(service, est_runtime_s=4 * 3600.0, deadline=(T + timedelta(hours=30)).isoformat(), qos="urgent")
    flexible = submit(service, est_runtime_s=4 * 3600.0, deadline=(T + timedelta(hours=30)).isoformat(),
                      qos="flexible")
    planner_with_standing(store).tick()
    assert planned_start(store, urgent) - T < SLOT
    assert planned_start(store, flexible) - T > timedelta(hours=2)


def test_the_account_that_used_its_share_goes_after_the_one_that_did_not(store, service):
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    with store.write() as conn:
        for name in ("flood", "quiet"):
            add_account(conn, name, now=T)
            add_user(conn, "root", name, now=T)
    ran = submit(service, est_runtime_s=3600.0, account="flood")
    with store.write() as conn:  # the flood account ran 20 GPU-hours yesterday
        conn.execute(update(jobs).where(jobs.c.id == ran).values(
            state="COMPLETED", started_at=T - timedelta(hours=22), ended_at=T - timedelta(hours=2), gpu_ids=[1]))
    first = submit(service, est_runtime_s=3600.0, account="flood", qos="urgent")
    second = submit(service, est_runtime_s=3600.0, account="quiet", qos="urgent")
    planner = planner_with_standing(store)
    with store.read() as conn:
        ranked = planner.standing.priorities(conn, [job_row(store, first), job_row(store, second)], T, 1)
    assert [b.job_id for b in ranked] == [second, first]
    planner.tick()
    assert planned_start(store, second) < planned_start(store, first)


def test_a_job_of_an_account_that_is_gone_plans_last_and_the_tick_goes_on(store, service):
    add_node(store, "de1", "DE")
    lost = submit(service, est_runtime_s=600.0)
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == lost).values(account="gone", qos="retired"))
    planner_with_standing(store).tick()
    assert job_row(store, lost).state == "PLANNED"


def test_share_shows_each_association_and_a_user_sees_the_accounts_and_their_own_lines(store, service):
    from scheduler.daemon.access import Caller

    with store.write() as conn:
        for name in ("flood", "quiet"):
            add_account(conn, name, now=T)
        add_user(conn, "root", "flood", now=T)
        add_user(conn, "40001", "quiet", now=T)
    ran = submit(service, est_runtime_s=3600.0, account="flood")
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == ran).values(
            state="COMPLETED", started_at=T - timedelta(hours=3), ended_at=T - timedelta(hours=1), gpu_ids=[1]))
    doc = service.standing.share(Caller(uid=0, gid=0))
    rows = {(r["account"], r["user"]): r for r in doc["associations"]}
    assert rows[("flood", "root")]["raw_usage_gpu_hours"] > 1.9
    assert rows[("flood", None)]["fair_share_factor"] < rows[("quiet", None)]["fair_share_factor"]
    assert doc["currency"] == "gpu_hours" and doc["half_life_s"] == 7 * 86400
    theirs = service.standing.share(Caller(uid=40001, gid=40001))["associations"]
    assert {r["user"] for r in theirs} == {None, "40001"}


def test_priority_lists_the_waiting_jobs_highest_first_and_a_user_only_their_own(store, service):
    from scheduler.daemon.access import Caller

    add_node(store, "de1", "DE")
    mine = service.submit(Caller(uid=40001, gid=40001), {"argv": ["true"], "gpus": 1, "qos": "flexible"})["id"]
    urgent = submit(service, est_runtime_s=60.0, qos="urgent")
    doc = service.standing.priority(Caller(uid=0, gid=0))
    assert [j["job_id"] for j in doc["jobs"]] == [urgent, mine]
    top = doc["jobs"][0]
    assert top["priority"] == top["fair_share"] + top["qos_priority"] + top["age"] + top["job_size"]
    assert [j["job_id"] for j in service.standing.priority(Caller(uid=40001, gid=40001))["jobs"]] == [mine]


def test_a_qos_gpu_limit_per_user_holds_the_jobs_beyond_it_with_their_reason(store, service):
    from scheduler.qos import qos_table

    add_node(store, "de1", "DE", n=3)
    first = submit(service, est_runtime_s=600.0, qos="urgent")
    second = submit(service, est_runtime_s=600.0, qos="urgent")
    other_qos = submit(service, est_runtime_s=600.0, qos="flexible")
    table = qos_table({"qos": {"urgent": {"max_gpus_running_per_user": 1}}})
    planner = Planner(store, make_policy("greedy", plan_interval_s=15.0), clock=lambda: T, plan_interval_s=15.0,
                      standing=Standing(table))
    planner.tick()
    assert job_row(store, first).state == "PLANNED" and job_row(store, other_qos).state == "PLANNED"
    held = job_row(store, second)
    assert held.state == "PENDING" and "(QOSMaxGPUPerUserLimit)" in held.reason
    with store.write() as conn:  # the first one runs now: the second is still held
        conn.execute(update(jobs).where(jobs.c.id == first).values(state="RUNNING", started_at=T, gpu_ids=[1]))
    planner.tick()
    held = job_row(store, second)
    assert held.state == "PENDING" and "1 running or planned first" in held.reason


# -- REASON: whose work a job waits behind ------------------------------------------------------

def two_accounts_one_using_its_share(store, service, *, heavy_user: str = "40001", light_user: str = "root"):
    """Accounts `flood` (`heavy_user`, ran 20 GPU-hours yesterday) and `quiet` (`light_user`)."""
    from scheduler.daemon.access import Caller

    with store.write() as conn:
        for name, user in (("flood", heavy_user), ("quiet", light_user)):
            add_account(conn, name, now=T)
            add_user(conn, user, name, now=T)
    uid = 0 if heavy_user == "root" else int(heavy_user)
    ran = service.submit(Caller(uid=uid, gid=uid), {"argv": ["true"], "gpus": 1, "account": "flood"})["id"]
    with store.write() as conn:
        conn.execute(update(jobs).where(jobs.c.id == ran).values(
            state="COMPLETED", started_at=T - timedelta(hours=22), ended_at=T - timedelta(hours=2), gpu_ids=[1]))


def test_a_job_behind_a_higher_priority_job_of_another_user_says_priority_and_nothing_of_that_job(store, service):
    from scheduler.daemon.access import Caller

    user = Caller(uid=40001, gid=40001)
    import_carbon(store, DE)
    add_node(store, "de1", "DE")
    two_accounts_one_using_its_share(store, service)
    mine = service.submit(user, {"argv": ["true"], "gpus": 1, "account": "flood", "est_runtime_s": 3600.0})["id"]
    theirs = submit(service, est_runtime_s=3600.0, account="quiet", name="secret-merger-eval")
    planner_with_standing(store).tick()
    assert planned_start(store, theirs) < planned_start(store, mine)
    seen = service.get_job(user, mine)
    assert seen["reason"].endswith("; waits: the GPUs free for it now are planned for jobs of a higher priority "
                                   "(Priority)")
    for secret in ("secret-merger-eval", "quiet", "root", f"job {theirs}"):
        assert secret not in seen["reason"]
    # queue lists the job with the same reason
    listed = {j["id"]: j for j in service.list_jobs(user)}
    assert listed[mine]["reason"] == seen["reason"]


def test_an_unplaced_job_behind_a_higher_priority_job_says_priority(store, service):
    add_node(store, "de1", "DE")
    two_accounts_one_using_its_share(store, service, heavy_user="root", light_user="40001")
    from scheduler.daemon.access import Caller

    # the quiet account's job holds the only GPU for longer than the planning horizon
    theirs = service.submit(Caller(uid=40001, gid=40001), {"argv": ["true"], "gpus": 1, "account": "quiet",
                                                           "est_runtime_s": 60 * 3600.0})["id"]
    mine = submit(service, est_runtime_s=3600.0, account="flood", deadline=(T + timedelta(hours=3)).isoformat())
    planner_with_standing(store).tick()
    assert job_row(store, theirs).state == "PLANNED"
    row = job_row(store, mine)
    assert row.state == "PENDING" and row.reason.endswith("(Priority)"), row.reason


def test_an_urgent_job_on_a_free_gpu_never_says_priority_or_resources(store, service):
    import_carbon(store, DE)
    add_node(store, "de1", "DE", n=2)
    two_accounts_one_using_its_share(store, service, heavy_user="root", light_user="40001")
    urgent = submit(service, est_runtime_s=4 * 3600.0, account="flood", qos="urgent")
    flexible = submit(service, est_runtime_s=4 * 3600.0, account="flood", qos="flexible",
                      deadline=(T + timedelta(hours=30)).isoformat())
    planner_with_standing(store).tick()
    row = job_row(store, urgent)
    assert planned_start(store, urgent) - T < SLOT
    assert "(Priority)" not in row.reason and "(Resources)" not in row.reason and "waits" not in row.reason
    # the flexible job waits for carbon by choice, with a GPU free: its reason is carbon's
    assert planned_start(store, flexible) - T > timedelta(hours=2)
    assert not job_row(store, flexible).reason.endswith(("(Priority)", "(Resources)"))


def test_a_job_behind_running_work_or_work_of_its_own_priority_says_resources(store, service):
    from scheduler.store.models import gpus

    [gpu] = add_node(store, "de1", "DE")
    running = submit(service, est_runtime_s=3600.0, qos="urgent")
    with store.write() as conn:  # it runs until about 13:00
        conn.execute(update(jobs).where(jobs.c.id == running).values(state="RUNNING", started_at=T,
                                                                     gpu_ids=[gpu], est_runtime_planned_s=3600.0))
        conn.execute(update(gpus).where(gpus.c.id == gpu).values(job_id=running))
    first = submit(service, est_runtime_s=1800.0, qos="urgent")
    second = submit(service, est_runtime_s=1800.0, qos="urgent")
    planner_with_standing(store).tick()
    assert planned_start(store, first) >= T + timedelta(hours=1)
    assert job_row(store, first).reason.endswith("busy with running jobs until 13:00 (Resources)")
    assert planned_start(store, second) > planned_start(store, first)
    assert job_row(store, second).reason.endswith("(Resources)")
