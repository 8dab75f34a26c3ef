"""Site power budgets (issue 29 item 3): the budget and its daily windows, planned as
PowerCaps; the head node's governor holding the measured GPU power of a zone within the cap
in force by lowering running jobs' limits (most slack first, never below the floor) and raising
them again with room; the agent applying a limit changed while its job runs. SQLite and
PostgreSQL (the `store` fixture)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, update

from policies.pricing.power_cap import CapBounds
from scheduler.clock import utcnow
from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.power_governor import PowerGovernor
from scheduler.daemon.service import JobService
from scheduler.node.agent import Agent
from scheduler.node.config import AgentConfig
from scheduler.power_budget import ZoneBudget, parse_zone_budget
from scheduler.site import SiteConfig
from scheduler.store.models import gpus, job_events, jobs
from telemetry.gpu import EmulatedBackend, EmulatedModel

import fleet

ROOT = Caller(uid=0, gid=0)
DAY = datetime(2026, 12, 2, tzinfo=timezone.utc)


def at(hh: int, mm: int = 0, day: int = 0) -> datetime:
    return DAY + timedelta(days=day, hours=hh, minutes=mm)


# -- the budget -----------------------------------------------------------------------------

def test_the_cap_in_force_is_the_lowest_of_the_constant_cap_and_the_windows_over_midnight_too():
    budget = parse_zone_budget("DE", {"power_cap_w": 2000, "power_windows": [
        {"start": "17:00", "end": "19:00", "cap_w": 1200}, {"start": "23:00", "end": "02:00", "cap_w": 1500}]})
    assert budget.cap_at(at(12)) == 2000 and budget.cap_at(at(17)) == 1200 and budget.cap_at(at(18, 59)) == 1200
    assert budget.cap_at(at(19)) == 2000  # [start, end)
    assert budget.cap_at(at(1, 30)) == 1500 and budget.cap_at(at(23, 30)) == 1500  # over midnight
    only_windows = parse_zone_budget("GB", {"power_windows": [{"start": "08:00", "end": "09:00", "cap_w": 900}]})
    assert only_windows.cap_at(at(8, 30)) == 900 and only_windows.cap_at(at(10)) is None
    assert parse_zone_budget("FR", {"pue": 1.2}) is None


def test_the_planner_sees_each_window_of_its_horizon_as_a_power_cap():
    site = SiteConfig.from_config({"zones": {"DE": {"power_cap_w": 2000, "power_windows": [
        {"start": "17:00", "end": "19:00", "cap_w": 1200}]}}})
    caps = site.power_caps(["DE"], at(16), 48 * 3600)
    assert [(c.cap_w, c.start, c.end) for c in caps] == [
        (2000.0, None, None), (1200.0, at(17), at(19)), (1200.0, at(17, day=1), at(19, day=1))]
    assert site.power_caps(["GB"], at(16), 48 * 3600) == ()
    assert site.power_caps(["DE"]) == (caps[0],)  # without a time: the caps always in force


@pytest.mark.parametrize("table, words", [
    ({"power_windows": [{"start": "17:00", "end": "19:00"}]}, "missing cap_w"),
    ({"power_windows": [{"start": "5pm", "end": "19:00", "cap_w": 10}]}, "HH:MM"),
    ({"power_windows": [{"start": "17:00", "end": "17:00", "cap_w": 10}]}, "empty window"),
    ({"power_windows": [{"start": "17:00", "end": "19:00", "cap_w": -1}]}, "positive number of watts"),
    ({"power_windows": {"start": "17:00"}}, "a list of tables"),
    ({"power_cap_w": True}, "positive number of watts"),
])
def test_a_bad_budget_is_refused_with_the_keys_path(table, words):
    with pytest.raises(ValueError, match=words) as e:
        SiteConfig.from_config({"zones": {"DE": table}})
    assert "zones.DE" in str(e.value) and "\n" not in str(e.value)


# -- the governor over a real agent and store -----------------------------------------------

@pytest.fixture
def node(store, tmp_path):
    """An agent with four emulated 700 W H100s in zone DE, and a service to submit with."""
    b = EmulatedBackend([EmulatedModel("H100", "nvidia", 80, 70, 700)] * 4, node="n1", seed=5,
                        limits_path=tmp_path / "limits.json")
    agent = Agent(store, b, AgentConfig(node="n1", zone="DE", state_dir=tmp_path / "state",
                                        grace_s=1.0, sample_hz=5.0, heartbeat_s=0.2))
    agent.register()
    agent.startup_reconcile()
    agent.start_sampling()
    service = JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "state" / "logs")
    yield agent, service, b
    cancel_running(agent, service, store)
    agent.stop()


def cancel_running(agent, service, store) -> None:
    """Cancel the test's `sleep 60` jobs and tick the agent until the store says they ended
    (an agent that stops leaves its jobs running, as it must: run late in the suite they
    would outlive it)."""
    with store.read() as conn:
        running = list(conn.execute(select(jobs.c.id).where(jobs.c.state == "RUNNING")).scalars())
    if running:
        service.cancel(ROOT, running)
        fleet.tick_until(store, running, {"CANCELLED"}, agent, timeout_s=30)


def start_jobs(agent, service, store, tmp_path, deadlines):
    """One 1-GPU `sleep 60` per deadline, started on GPUs 1, 2, ... at their default limit."""
    ids = sorted(agent._uuid_of)
    out = []
    for i, deadline in enumerate(deadlines):
        job = service.submit(ROOT, {"argv": ["sleep", "60"], "gpus": 1, "cwd": str(tmp_path),
                                    **({"deadline": deadline.isoformat()} if deadline else {})})["id"]
        with store.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job).values(
                state="PLANNED", planned_node="n1", planned_gpu_ids=[ids[i]], planned_start=utcnow()))
        out.append(job)
    deadline_s = time.monotonic() + 30
    while time.monotonic() < deadline_s:
        agent.tick()
        with store.read() as conn:
            if all(s == "RUNNING" for s in conn.execute(select(jobs.c.state).where(jobs.c.id.in_(out))).scalars()):
                return out
        time.sleep(0.05)
    raise TimeoutError("jobs did not start")


def measured_w(agent, store, gpu_ids, settle_s=1.2):
    """Let the agent sample and flush, then the zone's GPU power from the newest readings."""
    end = time.monotonic() + settle_s
    while time.monotonic() < end:
        agent.tick()
        time.sleep(0.1)
    return sum(r.power_w for r in agent.sampler.latest().values())


def limits_of(store, job_ids):
    with store.read() as conn:
        return {r.id: (r.planned_power_limit_w, r.power_limit_w)
                for r in conn.execute(select(jobs.c.id, jobs.c.planned_power_limit_w, jobs.c.power_limit_w)
                                      .where(jobs.c.id.in_(job_ids)))}


def test_over_its_cap_the_zone_is_brought_back_under_it_most_slack_first_and_limits_come_back_with_room(
        node, store, tmp_path):
    agent, service, backend = node
    soon, late = utcnow() + timedelta(hours=2), utcnow() + timedelta(days=2)
    urgent, relaxed, free = start_jobs(agent, service, store, tmp_path, [soon, late, None])
    before = measured_w(agent, store, None)  # three busy H100s (the load model: 70-95 % of 700 W) + an idle one
    assert before > 3 * 0.68 * 700
    cap = before - 200.0
    budgets = {"DE": ZoneBudget(cap_w=cap)}
    governor = PowerGovernor(store, budgets, CapBounds(min_fraction=0.3))
    actions = governor.tick()
    # the job without a deadline has the most slack: it is lowered first, and 200 W is within
    # what it alone can give (from its >= 490 W draw down to 30 % of 700 W), so it is the only one
    assert [a.job_id for a in actions] == [free] and actions[0].to_w >= 0.3 * 700
    assert governor.tick() == []  # no second cut on readings from before the first took effect
    agent.tick()  # the agent applies it
    lim = limits_of(store, [urgent, relaxed, free])
    assert lim[free][0] == lim[free][1] == actions[0].to_w and lim[urgent] == (None, None) == lim[relaxed]
    assert backend.power_limit(agent._uuid_of[job_gpu(store, free)]).current_w == actions[0].to_w
    after = measured_w(agent, store, None)
    assert after <= cap + 1.0, (before, cap, after)
    with store.read() as conn:
        reasons = [r for r in conn.execute(select(job_events.c.reason).where(job_events.c.job_id == free)).scalars()]
    assert any("power governor: zone DE measured" in r and "lowered" in r for r in reasons)
    assert any("set to" in r and "while running" in r for r in reasons)

    # A deeper cut than one job can give takes the next most relaxed one too, each at its floor at most
    governor.budgets = {"DE": ZoneBudget(cap_w=after - 500.0)}
    more = govern(governor, agent)
    order = [free, relaxed, urgent]
    ids = [a.job_id for a in more]
    assert relaxed in ids and ids == sorted(ids, key=order.index)  # most slack first, the urgent one last
    assert all(a.to_w >= 0.3 * 700 - 1e-9 for a in more)

    # Room again: raised back to the planned limit (the default here), least slack first
    governor.budgets = {"DE": ZoneBudget(cap_w=10_000.0)}
    back = govern(governor, agent)
    assert {a.job_id for a in back} == {a.job_id for a in actions + more} and all(a.to_w is None for a in back)
    agent.tick()
    assert all(v == (None, None) for v in limits_of(store, [urgent, relaxed, free]).values())
    assert not governor.lowered


def test_a_zone_within_its_cap_or_without_one_is_left_alone(node, store, tmp_path):
    agent, service, _ = node
    start_jobs(agent, service, store, tmp_path, [None, None])
    measured = measured_w(agent, store, None)
    assert PowerGovernor(store, {"DE": ZoneBudget(cap_w=measured + 500)}).tick() == []
    assert PowerGovernor(store, {"GB": ZoneBudget(cap_w=1.0)}).tick() == []  # no GPUs there
    window_later = ZoneBudget(windows=(parse_zone_budget("DE", {"power_windows": [
        {"start": _hhmm(utcnow() + timedelta(hours=2)), "end": _hhmm(utcnow() + timedelta(hours=3)),
         "cap_w": 1.0}]}).windows))
    assert PowerGovernor(store, {"DE": window_later}).tick() == []  # its window is not in force


def test_a_job_whose_gpus_refused_a_limit_is_not_governed(node, store, tmp_path):
    agent, service, backend = node
    (job,) = start_jobs(agent, service, store, tmp_path, [None])
    backend.deny_power_limits = True
    with store.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job).values(planned_power_limit_w=600.0))
    agent.tick()
    planned, applied = limits_of(store, [job])[job]
    assert applied is None  # not set: the job runs on as it was, with the reason
    with store.read() as conn:
        note = conn.execute(select(jobs.c.power_limit_note).where(jobs.c.id == job)).scalar_one()
    assert "could not be set" in note
    assert PowerGovernor(store, {"DE": ZoneBudget(cap_w=1.0)}).tick() == []


def govern(governor, agent, timeout_s: float = 10.0):
    """Governor ticks, the agent applying and sampling between them, until one acts."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        agent.tick()
        actions = governor.tick()
        if actions:
            return actions
        time.sleep(0.2)
    return []


def job_gpu(store, job_id) -> int:
    with store.read() as conn:
        return conn.execute(select(gpus.c.id).where(gpus.c.job_id == job_id)).scalar_one()


def _hhmm(t: datetime) -> str:
    return f"{t.hour:02d}:{t.minute:02d}"


def test_when_a_window_ends_the_limits_it_lowered_come_back(node, store, tmp_path):
    agent, service, _ = node
    (job,) = start_jobs(agent, service, store, tmp_path, [None])
    now = utcnow()
    window = lambda start, end: ZoneBudget(windows=parse_zone_budget("DE", {"power_windows": [  # noqa: E731
        {"start": _hhmm(start), "end": _hhmm(end), "cap_w": 200.0}]}).windows)
    governor = PowerGovernor(store, {"DE": window(now - timedelta(minutes=5), now + timedelta(minutes=30))},
                             CapBounds(min_fraction=0.3))
    measured_w(agent, store, None)
    assert [a.job_id for a in governor.tick()] == [job]
    governor.budgets = {"DE": window(now + timedelta(hours=2), now + timedelta(hours=3))}  # none in force now
    back = govern(governor, agent)
    assert [(a.job_id, a.to_w, a.cap_w) for a in back] == [(job, None, None)]
    agent.tick()
    assert limits_of(store, [job])[job] == (None, None)
    with store.read() as conn:
        reasons = list(conn.execute(select(job_events.c.reason).where(job_events.c.job_id == job)).scalars())
    assert any("has no cap in force now; limit raised to its default" in r for r in reasons), reasons


def test_a_zone_whose_agent_never_applies_a_limit_is_judged_again_after_the_settle_timeout(node, store, tmp_path):
    from scheduler.daemon.power_governor import SETTLE_TIMEOUT_S

    agent, service, _ = node
    first, second = start_jobs(agent, service, store, tmp_path, [None, None])
    measured = measured_w(agent, store, None)
    clock = {"now": utcnow()}
    governor = PowerGovernor(store, {"DE": ZoneBudget(cap_w=measured - 100.0)}, CapBounds(min_fraction=0.3),
                             clock=lambda: clock["now"])
    (acted,) = governor.tick()
    # the agent is "down": nothing applied; the governor waits for the result ...
    assert governor.tick() == []
    # ... but not for ever: then the zone, still over its cap, is judged again
    clock["now"] += timedelta(seconds=SETTLE_TIMEOUT_S + 1)
    again = governor.tick()
    assert again, "the zone stayed over its cap and the governor kept waiting"


# -- static power and dated events ----------------------------------------------------------------

def test_static_power_counts_against_every_cap_and_dated_events_cap_their_hours(tmp_path):
    schedule = tmp_path / "events.csv"
    schedule.write_text("start,end,cap_w\n2026-12-02T14:00:00Z,2026-12-02T15:30:00Z,1100\n"
                        "2026-12-03T08:00:00,2026-12-03T09:00:00,1300\n")  # no offset: UTC
    budget = parse_zone_budget("DE", {"power_cap_w": 2000, "static_power_w": 300, "power_schedule": str(schedule),
                                      "power_events": [{"start": "2026-12-02T20:00:00+01:00",
                                                        "end": "2026-12-02T21:00:00+01:00", "cap_w": 1500}]})
    assert budget.cap_at(at(12)) == 2000 and budget.gpu_cap_at(at(12)) == 1700
    assert budget.cap_at(at(14, 30)) == 1100 and budget.gpu_cap_at(at(14, 30)) == 800
    assert budget.cap_at(at(15, 30)) == 2000  # [start, end)
    assert budget.cap_at(at(19, 30)) == 1500  # 20:00+01:00 is 19:00 UTC
    assert budget.cap_at(at(8, 30, day=1)) == 1300
    site = SiteConfig.from_config({"zones": {"DE": {"power_cap_w": 2000, "static_power_w": 300,
                                                    "power_schedule": str(schedule)}}})
    caps = site.power_caps(["DE"], at(12), 48 * 3600)
    # the planner's caps are of GPU power: each less the static power
    assert [(c.cap_w, c.start, c.end) for c in caps] == [
        (1700.0, None, None), (800.0, at(14), at(15, 30)), (1000.0, at(8, day=1), at(9, day=1))]
    assert budget.changes_between(at(13), at(16)) == [at(14), at(15, 30)]


@pytest.mark.parametrize("table, words", [
    ({"power_cap_w": 1000, "static_power_w": 1000}, "leaves nothing"),
    ({"power_cap_w": 1000, "static_power_w": -5}, "0 or more"),
    ({"static_power_w": 100}, "the budget has none"),
    ({"power_events": [{"start": "2026-12-03T10:00Z", "end": "2026-12-03T09:00Z", "cap_w": 10}]}, "not after"),
    ({"power_events": [{"start": "tomorrow", "end": "2026-12-03T09:00Z", "cap_w": 10}]}, "date and time"),
    ({"power_events": {"start": "2026-12-03T10:00Z"}}, "a list of tables"),
    ({"power_schedule": "events.csv"}, "absolute path"),
    ({"power_schedule": "/nonexistent/carbonsched/events.csv"}, "cannot read"),
])
def test_a_bad_static_power_event_or_schedule_is_refused_with_the_keys_path(table, words):
    with pytest.raises(ValueError, match=words) as e:
        SiteConfig.from_config({"zones": {"DE": table}})
    assert "zones.DE" in str(e.value) and "\n" not in str(e.value)


def test_a_bad_schedule_row_is_refused_with_its_file_and_line(tmp_path):
    bad = tmp_path / "events.csv"
    bad.write_text("start,end,cap_w\n2026-12-02T14:00:00Z,2026-12-02T15:00:00Z,900\n"
                   "2026-12-02T16:00:00Z,2026-12-02T17:00:00Z,lots\n")
    with pytest.raises(ValueError, match=r"line 3.*positive number of watts"):
        SiteConfig.from_config({"zones": {"DE": {"power_schedule": str(bad)}}})
    bad.write_text("from,to,watts\n")
    with pytest.raises(ValueError, match="header must be start,end,cap_w"):
        SiteConfig.from_config({"zones": {"DE": {"power_schedule": str(bad)}}})


def test_the_governor_counts_the_sites_static_power(node, store, tmp_path):
    agent, service, _ = node
    start_jobs(agent, service, store, tmp_path, [None, None])
    measured = measured_w(agent, store, None)
    cap = measured + 300.0
    assert PowerGovernor(store, {"DE": ZoneBudget(cap_w=cap)}).tick() == []  # the GPUs alone fit
    governor = PowerGovernor(store, {"DE": ZoneBudget(cap_w=cap, static_w=600.0)}, CapBounds(min_fraction=0.3))
    actions = governor.tick()  # with the hosts' 600 W the site is ~300 W over
    assert actions and all(a.measured_w >= measured + 600.0 - 50.0 for a in actions)
    assert governor.last["DE"].static_w == 600.0
