"""scheduler.fair_share: who is owed GPUs, by Slurm's classic fair-share arithmetic.

Normalised shares are products down the account tree; usage decays with a half-life and is
normalised by the cluster's total; effective usage mixes in the parent's; the factor is
2^(-U_E/S). The worked example is the one on Slurm's "Classic Fairshare Algorithm" page.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from scheduler.fair_share import (DEFAULT_ACCOUNT, DEFAULT_HALF_LIFE_S, AccountSpec, AccountTree, Charge,
                                  DecayingUsage, FairShare, UserSpec, decay, decayed_usage, fair_share_factor,
                                  fairness_over_accounts, jain_index, share_targets, water_fill)

DAY_S = 86400.0
NOW_S = 1_800_000_000.0


def flat(**shares: float) -> AccountTree:
    """Top-level accounts with these raw shares, the built-in default account holding none."""
    return AccountTree([AccountSpec(n, None, s) for n, s in shares.items()] + [AccountSpec(DEFAULT_ACCOUNT, None, 0)])


def factors(fs: FairShare) -> dict[tuple[str, str | None], float]:
    return {(r.account, r.user): r.fair_share for r in fs.rows()}


# -- the account tree and normalised shares --------------------------------------------

def test_a_default_account_exists_without_any_setup_and_holds_the_whole_machine():
    tree = AccountTree()
    assert tree.accounts == [DEFAULT_ACCOUNT]
    assert tree.norm_shares() == {(DEFAULT_ACCOUNT, None): 1.0}


def test_the_default_account_keeps_one_share_beside_the_operators_accounts_unless_set():
    tree = AccountTree([AccountSpec("research", None, 1), AccountSpec("ops", None, 1)])
    assert tree.norm_shares()[("research", None)] == pytest.approx(1 / 3)
    assert flat(research=1, ops=1).norm_shares()[("research", None)] == pytest.approx(1 / 2)


def test_two_accounts_one_to_three():
    s = flat(a=1, b=3).norm_shares()
    assert s[("a", None)] == pytest.approx(0.25) and s[("b", None)] == pytest.approx(0.75)


def test_normalised_shares_multiply_down_the_tree():
    """research 3 : ops 1 at the top; inside research, nlp 1 : vision 2."""
    tree = AccountTree([AccountSpec("research", None, 3), AccountSpec("ops", None, 1),
                        AccountSpec(DEFAULT_ACCOUNT, None, 0), AccountSpec("research/nlp", "research", 1),
                        AccountSpec("research/vision", "research", 2)])
    s = tree.norm_shares()
    assert s[("research", None)] == pytest.approx(0.75)
    assert s[("research/nlp", None)] == pytest.approx(0.75 * 1 / 3)
    assert s[("research/vision", None)] == pytest.approx(0.75 * 2 / 3)


def test_users_share_their_account_equally_unless_given_shares():
    tree = AccountTree([AccountSpec("a", None, 1), AccountSpec(DEFAULT_ACCOUNT, None, 1)],
                       [UserSpec("a", "ann"), UserSpec("a", "bob"), UserSpec("a", "cy", 2)])
    s = tree.norm_shares()
    assert s[("a", "ann")] == pytest.approx(0.5 / 4) and s[("a", "bob")] == pytest.approx(0.5 / 4)
    assert s[("a", "cy")] == pytest.approx(0.5 * 2 / 4)


def test_users_and_sub_accounts_of_one_account_are_siblings():
    tree = AccountTree([AccountSpec("a"), AccountSpec("a/sub", "a", 3), AccountSpec(DEFAULT_ACCOUNT, None, 0)],
                       [UserSpec("a", "ann")])
    s = tree.norm_shares()
    assert s[("a", "ann")] == pytest.approx(0.25) and s[("a/sub", None)] == pytest.approx(0.75)
    assert tree.associations == [("a", None), ("a", "ann"), ("a/sub", None), (DEFAULT_ACCOUNT, None)]


# -- usage and its decay -----------------------------------------------------------------

def test_usage_halves_after_one_half_life_and_quarters_after_two():
    c = Charge("a", "ann", at_s=NOW_S, gpu_hours=8.0)
    at = lambda t: decayed_usage([c], t)[("a", "ann")]  # noqa: E731
    assert at(NOW_S) == pytest.approx(8.0)
    assert at(NOW_S + DEFAULT_HALF_LIFE_S) == pytest.approx(4.0)
    assert at(NOW_S + 2 * DEFAULT_HALF_LIFE_S) == pytest.approx(2.0)
    assert DEFAULT_HALF_LIFE_S == 7 * DAY_S


def test_usage_is_counted_in_the_chosen_currency_times_the_qos_usage_factor():
    c = Charge("a", "ann", at_s=NOW_S, gpu_hours=10.0, kwh=7.0, kgco2e=2.0, usage_factor=0.5)
    assert decayed_usage([c], NOW_S)[("a", "ann")] == pytest.approx(5.0)
    assert decayed_usage([c], NOW_S, currency="kwh")[("a", "ann")] == pytest.approx(3.5)
    assert decayed_usage([c], NOW_S, currency="kgco2e")[("a", "ann")] == pytest.approx(1.0)


def test_a_charge_spread_over_its_run_counts_as_many_small_charges():
    """A job that ran 3 days to a finish 2 days ago: the mean decay over its run, not the
    decay at its end (which would overcount) nor at its start."""
    spread = Charge("a", "ann", at_s=NOW_S - 2 * DAY_S, gpu_hours=72.0, duration_s=3 * DAY_S)
    n = 3000
    pieces = [Charge("a", "ann", at_s=NOW_S - 5 * DAY_S + (i + 0.5) * 3 * DAY_S / n, gpu_hours=72.0 / n)
              for i in range(n)]
    assert decayed_usage([spread], NOW_S)[("a", "ann")] == pytest.approx(
        decayed_usage(pieces, NOW_S)[("a", "ann")], rel=1e-6)
    assert decayed_usage([spread], NOW_S)[("a", "ann")] < 72.0 * decay(2 * DAY_S, DEFAULT_HALF_LIFE_S)


def test_a_running_job_counts_its_usage_so_far():
    """Two GPUs for the last 6 hours, still running: one charge ending now."""
    so_far = Charge("a", "ann", at_s=NOW_S, gpu_hours=2 * 6.0, duration_s=6 * 3600)
    used = decayed_usage([so_far], NOW_S)[("a", "ann")]
    assert 12.0 * decay(6 * 3600, DEFAULT_HALF_LIFE_S) < used < 12.0


def test_the_incremental_accumulator_equals_the_batch_sum():
    rng = random.Random(7)
    charges = [Charge(rng.choice("abc"), rng.choice(["ann", "bob"]), at_s=NOW_S - rng.uniform(0, 30 * DAY_S),
                      gpu_hours=rng.uniform(0, 50), usage_factor=rng.choice([0.5, 1.0, 2.0]),
                      duration_s=rng.choice([0.0, rng.uniform(0, 2 * DAY_S)])) for _ in range(300)]
    acc = DecayingUsage()
    for c in charges:  # in arrival order, not time order: late charges are folded in too
        acc.add(c)
    batch = decayed_usage(charges, NOW_S)
    totals = acc.totals(NOW_S)
    assert totals.keys() == batch.keys()
    for key in batch:
        assert totals[key] == pytest.approx(batch[key], rel=1e-9)


def test_the_accumulator_adds_running_jobs_so_far_without_keeping_them():
    acc = DecayingUsage()
    acc.add(Charge("a", "ann", at_s=NOW_S - DAY_S, gpu_hours=10.0))
    running = Charge("a", "ann", at_s=NOW_S, gpu_hours=3.0, duration_s=3 * 3600)
    with_running = acc.totals(NOW_S, running=[running])[("a", "ann")]
    so_far = decayed_usage([running], NOW_S)[("a", "ann")]
    assert with_running == pytest.approx(acc.totals(NOW_S)[("a", "ann")] + so_far)
    assert acc.totals(NOW_S)[("a", "ann")] == pytest.approx(10.0 * decay(DAY_S, DEFAULT_HALF_LIFE_S))


def test_the_accumulator_charged_in_time_order_decays_between_events():
    acc = DecayingUsage(half_life_s=DAY_S)
    acc.add(Charge("a", "ann", at_s=NOW_S, gpu_hours=4.0))
    acc.add(Charge("a", "ann", at_s=NOW_S + DAY_S, gpu_hours=1.0))
    assert acc.totals(NOW_S + DAY_S)[("a", "ann")] == pytest.approx(3.0)
    assert acc.totals(NOW_S + 2 * DAY_S)[("a", "ann")] == pytest.approx(1.5)


# -- the factor --------------------------------------------------------------------------

def test_no_usage_anywhere_gives_every_association_factor_one():
    assert set(factors(FairShare(flat(a=1, b=3), {})).values()) == {0.0, 1.0}  # default: no share, 0
    assert factors(FairShare(flat(a=1, b=3), {}))[("a", None)] == 1.0


def test_equal_use_of_equal_shares_is_exactly_on_target():
    fs = FairShare(flat(a=1, b=1), {("a", "ann"): 10.0, ("b", "bob"): 10.0})
    assert factors(fs)[("a", "ann")] == pytest.approx(0.5) and factors(fs)[("b", "bob")] == pytest.approx(0.5)


def test_one_to_three_shares_used_half_and_half_by_hand():
    """U = 0.5 each; F(a) = 2^(-0.5/0.25) = 0.25, F(b) = 2^(-0.5/0.75) = 0.63."""
    fs = FairShare(flat(a=1, b=3), {("a", "ann"): 10.0, ("b", "bob"): 10.0})
    assert fs.factor("a", "ann") == pytest.approx(0.25)
    assert fs.factor("b", "bob") == pytest.approx(2 ** (-2 / 3))


def test_slurms_worked_example_of_effective_usage_under_a_hierarchy():
    """Slurm's classic fair-share page: A 40 (B 30, C 10), D 60 (E 25, F 35); user1 in B,
    users 2 and 3 in C, user4 in E, user5 in F; users 1, 2 and 4 used 0.2, 0.25 and 0.25 of
    the machine (the rest, 0.3, by someone in a no-share account)."""
    tree = AccountTree([AccountSpec("A", None, 40), AccountSpec("D", None, 60), AccountSpec("B", "A", 30),
                        AccountSpec("C", "A", 10), AccountSpec("E", "D", 25), AccountSpec("F", "D", 35),
                        AccountSpec(DEFAULT_ACCOUNT, None, 0)],
                       [UserSpec("B", "u1"), UserSpec("C", "u2"), UserSpec("C", "u3"), UserSpec("E", "u4"),
                        UserSpec("F", "u5")])
    fs = FairShare(tree, {("B", "u1"): 20.0, ("C", "u2"): 25.0, ("E", "u4"): 25.0, (DEFAULT_ACCOUNT, "x"): 30.0})
    rows = {(r.account, r.user): r for r in fs.rows()}
    assert rows[("A", None)].effective_usage == pytest.approx(0.45)
    assert rows[("B", None)].effective_usage == pytest.approx(0.3875)
    assert rows[("C", None)].effective_usage == pytest.approx(0.3)
    assert rows[("F", None)].effective_usage == pytest.approx(0.25 * 35 / 60)
    assert rows[("C", "u2")].effective_usage == pytest.approx(0.275)
    assert rows[("C", "u3")].effective_usage == pytest.approx(0.15)
    expected = {"u1": 0.408479, "u2": 0.022097, "u3": 0.125, "u4": 0.5, "u5": 0.749154}
    for (account, user), row in rows.items():
        if user in expected:
            assert row.fair_share == pytest.approx(expected[user], abs=1e-6), user


def test_a_flooding_account_falls_below_an_idle_one():
    """Four equal accounts; `flood` ran 70 % of the GPU-hours, the others 10 % each, `idle` none."""
    tree = flat(flood=1, b=1, c=1, idle=1)
    fs = FairShare(tree, {("flood", "f"): 70.0, ("b", "x"): 15.0, ("c", "y"): 15.0})
    assert fs.factor("flood", "f") < 0.5 < fs.factor("b", "x") < fs.factor("idle", "z") == 1.0


def test_a_new_user_inherits_the_accounts_standing_not_a_clean_slate():
    """A user who never ran anything in an over-served account is still held to the
    account's usage (Slurm's point of effective usage)."""
    fs = FairShare(flat(busy=1, calm=1), {("busy", "old"): 30.0, ("calm", "c"): 10.0})
    assert fs.factor("busy", "newcomer") < fs.factor("calm", "newcomer")
    assert fs.factor("busy", "newcomer") == pytest.approx(factors(fs)[("busy", None)])


def test_an_association_with_no_share_has_factor_zero():
    assert fair_share_factor(0.0, 0.0) == 0.0 and fair_share_factor(0.3, 0.0) == 0.0
    assert FairShare(flat(a=1), {(DEFAULT_ACCOUNT, "ann"): 1.0}).factor(DEFAULT_ACCOUNT, "ann") == 0.0


def test_share_rows_read_like_sshare_and_are_json_ready():
    fs = FairShare(flat(a=1, b=3), {("a", "ann"): 10.0, ("b", "bob"): 30.0})
    rows = fs.to_json(currency="kwh")
    json.dumps(rows)
    assert [(r["account"], r["user"]) for r in rows] == [("a", None), ("a", "ann"), ("b", None), ("b", "bob"),
                                                         (DEFAULT_ACCOUNT, None)]
    assert set(rows[1]) == {"account", "user", "raw_shares", "norm_shares", "raw_usage_kwh", "norm_usage",
                            "effective_usage", "fair_share_factor"}
    assert rows[0]["raw_usage_kwh"] == 10.0 and rows[2]["norm_usage"] == pytest.approx(0.75)
    assert "raw_usage_gpu_hours" in fs.to_json()[0]


# -- targets and fairness for the simulator's report --------------------------------------

def test_share_targets_renormalise_over_the_accounts_that_had_work():
    shares = {"a": 0.25, "b": 0.25, "c": 0.5}
    assert share_targets(shares, ["a", "b", "c"]) == pytest.approx({"a": 0.25, "b": 0.25, "c": 0.5})
    assert share_targets(shares, ["a", "c"]) == pytest.approx({"a": 1 / 3, "c": 2 / 3})
    assert share_targets(shares, []) == {}


def test_tree_targets_give_an_idle_sub_accounts_share_to_its_busy_sibling_first():
    """research (3) has nlp and vision; ops (1). With vision idle, nlp gets all of research's
    3/4, not a flat renormalisation over nlp and ops."""
    tree = AccountTree([AccountSpec("research", None, 3), AccountSpec("ops", None, 1),
                        AccountSpec(DEFAULT_ACCOUNT, None, 0), AccountSpec("nlp", "research", 1),
                        AccountSpec("vision", "research", 1)])
    assert tree.share_targets(["nlp", "ops"]) == pytest.approx({"nlp": 0.75, "ops": 0.25})
    flat_tree = flat(a=1, b=1, c=2)
    norm = {a: s for (a, u), s in flat_tree.norm_shares().items()}
    assert flat_tree.share_targets(["a", "c"]) == pytest.approx(share_targets(norm, ["a", "c"]))


def test_tree_targets_weigh_an_accounts_own_jobs_by_its_users_shares_beside_its_sub_accounts():
    """research (3) holds user ann (1 share) beside nlp (1) and vision (2); vision is idle,
    so research's 3/4 goes half to its own jobs and half to nlp."""
    tree = AccountTree([AccountSpec("research", None, 3), AccountSpec("ops", None, 1),
                        AccountSpec(DEFAULT_ACCOUNT, None, 0), AccountSpec("nlp", "research", 1),
                        AccountSpec("vision", "research", 2)], [UserSpec("research", "ann")])
    assert tree.share_targets(["research", "nlp", "ops"]) == pytest.approx({"research": 0.375, "nlp": 0.375,
                                                                            "ops": 0.25})


def test_jains_index_is_one_for_equal_ratios_and_one_over_n_for_one_takes_all():
    assert jain_index([1.2, 1.2, 1.2, 1.2]) == pytest.approx(1.0)
    assert jain_index([4.0, 0.0, 0.0, 0.0]) == pytest.approx(1 / 4)
    assert 1 / 4 < jain_index([2.0, 1.0, 0.5, 0.5]) < 1.0
    assert jain_index([]) is None and jain_index([0.0, 0.0]) is None  # nothing to compare


def test_fairness_over_accounts_compares_delivered_with_target():
    targets = {"a": 0.25, "b": 0.75}
    assert fairness_over_accounts({"a": 0.25, "b": 0.75}, targets) == pytest.approx(1.0)
    assert fairness_over_accounts({"a": 1.0, "b": 0.0}, targets) == pytest.approx(1 / 2)


# -- bad input: one line, ValueError ------------------------------------------------------

@pytest.mark.parametrize("build, words", [
    (lambda: AccountTree([AccountSpec("a", None, -1)]), "shares must be"),
    (lambda: AccountTree([AccountSpec("a", None, math.nan)]), "shares must be"),
    (lambda: AccountTree([AccountSpec("a", "nowhere")]), "unknown parent"),
    (lambda: AccountTree([AccountSpec("a", "b"), AccountSpec("b", "a")]), "cycle"),
    (lambda: AccountTree([AccountSpec("a", "a")]), "cycle"),
    (lambda: AccountTree([AccountSpec("a"), AccountSpec("a")]), "twice"),
    (lambda: AccountTree([AccountSpec("x"), AccountSpec(DEFAULT_ACCOUNT, "x")]), "top level"),
    (lambda: AccountTree([AccountSpec("")]), "non-empty"),
    (lambda: AccountTree(users=[UserSpec("nowhere", "ann")]), "unknown account"),
    (lambda: AccountTree(users=[UserSpec(DEFAULT_ACCOUNT, "ann", -2)]), "shares must be"),
    (lambda: FairShare(AccountTree(), {("nowhere", "ann"): 1.0}), "unknown account"),
    (lambda: FairShare(AccountTree(), {(DEFAULT_ACCOUNT, "ann"): -1.0}), "usage of"),
    (lambda: FairShare(AccountTree(), {}).factor("nowhere", "ann"), "unknown account"),
    (lambda: decayed_usage([Charge("a", "u", at_s=NOW_S + 1, gpu_hours=1)], NOW_S), "future"),
    (lambda: decayed_usage([Charge("a", "u", at_s=NOW_S, gpu_hours=1)], NOW_S, half_life_s=0), "half-life"),
    (lambda: decayed_usage([Charge("a", "u", at_s=NOW_S, gpu_hours=1)], NOW_S, currency="euros"), "currency"),
    (lambda: decayed_usage([Charge("a", "u", at_s=NOW_S, gpu_hours=1)], NOW_S, currency="kwh"), "no kwh"),
    (lambda: decayed_usage([Charge("a", "u", at_s=NOW_S, gpu_hours=-1)], NOW_S), "negative"),
    (lambda: DecayingUsage(currency="euros"), "currency"),
    (lambda: share_targets({"a": 1.0}, ["b"]), "unknown account"),
    (lambda: jain_index([1.0, -1.0]), ">= 0"),
])
def test_bad_input_is_a_one_line_value_error(build, words):
    with pytest.raises(ValueError, match=words) as caught:
        build()
    assert "\n" not in str(caught.value)


def test_water_fill_gives_no_account_more_than_it_asked_and_splits_the_rest_by_shares():
    # four equal accounts, one asks for most: the small ones get all they asked, the big one the rest
    got = water_fill(100.0, {"big": 1, "a": 1, "b": 1, "c": 1}, {"big": 90.0, "a": 10.0, "b": 10.0, "c": 10.0})
    assert got == pytest.approx({"big": 70.0, "a": 10.0, "b": 10.0, "c": 10.0})
    # two accounts 1:3 that both ask for more than there is: split by shares
    assert water_fill(40.0, {"x": 1, "y": 3}, {"x": 100.0, "y": 100.0}) == pytest.approx({"x": 10.0, "y": 30.0})
