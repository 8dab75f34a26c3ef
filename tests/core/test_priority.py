"""scheduler.priority: the multifactor priority that decides who gets contested GPUs first.

priority = 10000 * fair share + 20000 * QOS + 0 * age + 0 * size by default (an operator may
weigh age and size), each factor in [0, 1]; the queue is sorted highest first, then earliest
eligible, then lowest job id. With the built-in QOS levels an urgent job ranks above every
other job whatever the accounts' usage, and fair share orders the jobs within a level.
"""

from __future__ import annotations

import json

import pytest

from scheduler.fair_share import DEFAULT_ACCOUNT, AccountSpec, AccountTree, FairShare
from scheduler.priority import (DEFAULT_MAX_AGE_S, PriorityJob, PriorityWeights, QosFactors, age_factor,
                                job_size_factor, priority_of, queue_priorities)
from scheduler.qos import QosTable

DAY_S = 86400.0
NOW_S = 1_800_000_000.0
QOS = {"urgent": 100, "normal": 50, "flexible": 10}
BUILT_IN = QosTable().priorities()  # urgent 100, normal 10, flexible 0


def job(job_id, account="a", user="ann", qos="normal", gpus=1, waited_s=0.0) -> PriorityJob:
    return PriorityJob(job_id, account, user, qos, gpus, eligible_at_s=NOW_S - waited_s)


def order(breakdowns) -> list:
    return [b.job_id for b in breakdowns]


# -- the factors -------------------------------------------------------------------------

def test_age_grows_linearly_to_one_at_the_max_age_and_stays_there():
    assert DEFAULT_MAX_AGE_S == 7 * DAY_S
    assert age_factor(0.0) == 0.0
    assert age_factor(3.5 * DAY_S) == pytest.approx(0.5)
    assert age_factor(30 * DAY_S) == 1.0
    assert age_factor(-60.0) == 0.0  # not yet eligible (a later begin time)


def test_qos_factor_is_its_priority_over_the_highest():
    q = QosFactors(QOS)
    assert (q("urgent"), q("normal"), q("flexible")) == (1.0, 0.5, 0.1)
    assert QosFactors({"only": 0})("only") == 0.0


def test_job_size_favours_large_jobs_by_default_as_slurm_does():
    assert job_size_factor(2, 8) == 0.25 and job_size_factor(16, 8) == 1.0
    assert job_size_factor(1, 8, favor_small=True) == 1.0
    assert job_size_factor(8, 8, favor_small=True) == pytest.approx(1 / 8)
    assert job_size_factor(1, 0) == 0.0  # no fleet yet: no size preference


# -- one job's priority, by hand -----------------------------------------------------------

def test_priority_is_the_weighted_sum_of_its_components_by_hand():
    """F 0.5, QOS normal (0.5), waited 1.75 days (0.25), 2 of 8 GPUs (0.25), with a site's
    weights for age (1000) and size (200): 5000 + 10000 + 250 + 50 = 15300."""
    b = priority_of(job(1, gpus=2, waited_s=1.75 * DAY_S), now_s=NOW_S, fair_share_factor=0.5,
                    qos_priority=QOS, fleet_gpus=8, weights=PriorityWeights(age=1000, job_size=200))
    assert (b.fair_share, b.qos_component, b.age, b.job_size) == pytest.approx((5000, 10000, 250, 50))
    assert b.priority == pytest.approx(15300)
    assert (b.fair_share_factor, b.qos_factor, b.age_factor, b.job_size_factor) == pytest.approx((0.5, 0.5, 0.25, 0.25))


def test_weights_are_the_operators_to_set():
    w = PriorityWeights(fair_share=0, qos=0, age=1, job_size=0, max_age_s=DAY_S)
    b = priority_of(job(1, waited_s=DAY_S / 2), now_s=NOW_S, fair_share_factor=1.0, qos_priority=QOS,
                    fleet_gpus=8, weights=w)
    assert b.priority == pytest.approx(0.5)


def test_the_breakdown_is_json_ready_like_a_line_of_sprio():
    b = priority_of(job(7, qos="urgent"), now_s=NOW_S, fair_share_factor=1.0, qos_priority=QOS, fleet_gpus=8)
    d = b.to_dict()
    json.dumps(d)
    assert d["job_id"] == 7 and d["qos"] == "urgent" and d["qos_priority"] == pytest.approx(20000)
    assert d["priority"] == pytest.approx(d["fair_share"] + d["qos_priority"] + d["age"] + d["job_size"])


# -- the queue ---------------------------------------------------------------------------

def test_the_queue_is_sorted_by_priority_then_eligible_time_then_job_id():
    jobs = [job(3), job(2), job(1, waited_s=0.0), job(9, qos="urgent"), job(4, waited_s=600.0)]
    ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=lambda a, u: 0.5, qos_priority=QOS, fleet_gpus=8,
                              weights=PriorityWeights(age=0))
    assert order(ranked) == [9, 4, 1, 2, 3]


def test_inside_one_account_urgent_goes_before_normal_before_flexible():
    jobs = [job(1, qos="flexible", waited_s=DAY_S), job(2, qos="normal", waited_s=DAY_S), job(3, qos="urgent")]
    ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=lambda a, u: 0.4, qos_priority=QOS, fleet_gpus=8)
    assert order(ranked) == [3, 2, 1]


def test_the_default_weights_put_the_qos_factor_above_the_whole_fair_share_range():
    w = PriorityWeights()
    assert (w.fair_share, w.qos, w.age, w.job_size) == (10000, 20000, 0, 0)
    q = QosFactors(BUILT_IN)
    assert (q("urgent") - q("normal")) * w.qos > w.fair_share


def test_an_urgent_job_of_a_heavy_account_ranks_above_a_normal_job_of_an_unused_one():
    """The urgent lane never queues behind normal work: the flooder's fresh 1-GPU urgent job
    goes before the idle account's week-old, fleet-wide normal job, also where a site weighs
    age and size (below 8000 together)."""
    def factor(account: str, user: str) -> float:  # the extremes: all the usage, none of it
        return 0.0 if account == "flood" else 1.0

    jobs = [job("quiet-1", "quiet", "q", "normal", gpus=8, waited_s=30 * DAY_S),
            job("flood-1", "flood", "f", "urgent", gpus=1)]
    for weights in (PriorityWeights(), PriorityWeights(age=6000, job_size=1900)):
        ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=factor, qos_priority=BUILT_IN, fleet_gpus=8,
                                  weights=weights)
        assert order(ranked) == ["flood-1", "quiet-1"]


def test_within_a_qos_level_an_account_at_twice_its_share_never_outranks_an_unused_account():
    """Whatever the age or size: the flooder's week-old, fleet-wide job of a QOS level comes
    after the idle account's fresh 1-GPU job of the same level; and the flooder's normal job
    after the idle account's flexible one (a QOS step of 2000 points against a fair-share gap
    of 7500)."""
    tree = AccountTree([AccountSpec("flood"), AccountSpec("quiet"), AccountSpec(DEFAULT_ACCOUNT, None, 0)])
    fs = FairShare(tree, {("flood", "f"): 100.0})  # U = 1 against S = 0.5: U/S = 2
    assert fs.factor("flood", "f") == pytest.approx(0.25)
    for flood_qos, quiet_qos in (("urgent", "urgent"), ("normal", "normal"), ("flexible", "flexible"),
                                 ("normal", "flexible")):
        jobs = [job("flood-1", "flood", "f", flood_qos, gpus=8, waited_s=30 * DAY_S),
                job("quiet-1", "quiet", "q", quiet_qos, gpus=1)]
        for weights in (PriorityWeights(), PriorityWeights(age=2000, job_size=500)):
            ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=fs.factor, qos_priority=BUILT_IN, fleet_gpus=8,
                                      weights=weights)
            assert order(ranked) == ["quiet-1", "flood-1"], (flood_qos, quiet_qos, weights)


def test_by_default_equal_jobs_of_one_owner_have_one_priority_whatever_their_age_and_size():
    """The planner plans each distinct priority as a tier; age and size weigh nothing unless
    the operator says so, so one account's jobs of one QOS form one tier."""
    jobs = [job(1, gpus=1, waited_s=0), job(2, gpus=8, waited_s=5 * DAY_S)]
    ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=lambda a, u: 0.5, qos_priority=QOS, fleet_gpus=8)
    assert len({b.priority for b in ranked}) == 1


def test_a_flooding_accounts_jobs_queue_behind_the_other_accounts():
    """Four equal accounts; one ran 70 % of the usage and floods the queue with 20 jobs that
    are older than the others' single jobs: the others' jobs come first."""
    tree = AccountTree([AccountSpec(n) for n in ("flood", "b", "c", "d")] + [AccountSpec(DEFAULT_ACCOUNT, None, 0)])
    fs = FairShare(tree, {("flood", "f"): 70.0, ("b", "x"): 10.0, ("c", "y"): 10.0, ("d", "z"): 10.0})
    jobs = [job(i, "flood", "f", waited_s=DAY_S) for i in range(20)]
    jobs += [job(100, "b", "x"), job(101, "c", "y"), job(102, "d", "z")]
    ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=fs.factor, qos_priority=QOS, fleet_gpus=8)
    assert order(ranked)[:3] == [100, 101, 102]


def test_fair_share_off_leaves_qos_age_and_size():
    ranked = queue_priorities([job(1, waited_s=DAY_S), job(2, qos="urgent")], now_s=NOW_S, fair_share=None,
                              qos_priority=QOS, fleet_gpus=8)
    assert [b.fair_share_factor for b in ranked] == [0.0, 0.0]
    assert order(ranked) == [2, 1]


def test_the_queue_asks_each_association_once_however_many_jobs_it_has():
    asked: list[tuple[str, str]] = []

    def factor(account: str, user: str) -> float:
        asked.append((account, user))
        return 0.5

    jobs = [job(i, account=f"acc{i % 4}", user=f"u{i % 8}") for i in range(4000)]
    ranked = queue_priorities(jobs, now_s=NOW_S, fair_share=factor, qos_priority=QOS, fleet_gpus=64)
    assert len(ranked) == 4000
    assert sorted(asked) == sorted(set(asked)) and len(asked) == 8


# -- bad input: one line, ValueError ------------------------------------------------------

@pytest.mark.parametrize("build, words", [
    (lambda: PriorityWeights(fair_share=-1), "weight fair_share"),
    (lambda: PriorityWeights(age=float("inf")), "weight age"),
    (lambda: PriorityWeights(max_age_s=0), "max age"),
    (lambda: QosFactors({"bad": -5}), "QOS 'bad'"),
    (lambda: priority_of(job(1, qos="gold"), now_s=NOW_S, fair_share_factor=0.5, qos_priority=QOS, fleet_gpus=8),
     "unknown QOS 'gold'"),
    (lambda: priority_of(job(1), now_s=NOW_S, fair_share_factor=1.5, qos_priority=QOS, fleet_gpus=8), r"\[0, 1\]"),
    (lambda: priority_of(job(1, gpus=0), now_s=NOW_S, fair_share_factor=0.5, qos_priority=QOS, fleet_gpus=8),
     "at least 1 GPU"),
])
def test_bad_input_is_a_one_line_value_error(build, words):
    with pytest.raises(ValueError, match=words) as caught:
        build()
    assert "\n" not in str(caught.value)
