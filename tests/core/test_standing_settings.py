"""The operator's `[priority]` weights and `[fair_share]` half-life and currency (as Slurm's
PriorityWeight* and PriorityDecayHalfLife in slurm.conf) reach the daemon's standing: every
key checked, a mistake one line naming the key, unset keys the documented defaults."""

from __future__ import annotations

import pytest

from scheduler.daemon.access import Caller, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.fair_share import DEFAULT_HALF_LIFE_S
from scheduler.priority import PriorityWeights
from scheduler.standing import StandingSettings, check_standing_config, standing_settings


def test_no_tables_give_the_documented_defaults():
    s = standing_settings({})
    assert s == StandingSettings()
    assert (s.weights.qos, s.weights.fair_share, s.half_life_s, s.currency) == (20000.0, 10000.0,
                                                                                DEFAULT_HALF_LIFE_S, "gpu_hours")


def test_the_operator_s_weights_half_life_and_currency_are_taken():
    s = standing_settings({"priority": {"weight_qos": 5000, "weight_fair_share": 10000, "weight_age": 100,
                                        "max_age": "3d", "favor_small": True},
                           "fair_share": {"half_life": "14d", "currency": "kgco2e", "enabled": False}},
                          flexible_grace_pct=10.0)
    assert s.weights == PriorityWeights(fair_share=10000, qos=5000, age=100, job_size=0.0, max_age_s=3 * 86400.0,
                                        favor_small=True)
    assert (s.half_life_s, s.currency, s.fair_share, s.flexible_grace_pct) == (14 * 86400.0, "kgco2e", False, 10.0)


@pytest.mark.parametrize(("config", "message"), [
    ({"priority": {"weight_qos": -1}}, "[priority]: priority weight qos must be a finite number >= 0"),
    ({"priority": {"weight_qos": "high"}}, "[priority] weight_qos must be a number >= 0"),
    ({"priority": {"qos": 1}}, "[priority]: unknown key(s) qos; known: weight_fair_share"),
    ({"priority": {"favor_small": "yes"}}, "[priority] favor_small must be true or false"),
    ({"fair_share": {"currency": "dollars"}}, "[fair_share] currency must be one of gpu_hours, kwh, kgco2e"),
    ({"fair_share": {"half_life": "-2d"}}, "[fair_share] half_life"),
    ({"fair_share": {"enabled": 1}}, "[fair_share] enabled must be true or false"),
    ({"fair_share": 3}, "[fair_share] must be a table"),
])
def test_a_mistake_is_one_line_naming_the_key(config, message):
    with pytest.raises(ValueError) as e:
        standing_settings(config)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    (name, table), = config.items()
    assert check_standing_config(name, table) == [str(e.value).removeprefix(f"[{name}]").lstrip(": ")]


def test_the_daemon_s_priority_verb_shows_the_configured_weights(store, tmp_path):
    config = ServiceConfig(daemon_uid=0, standing=standing_settings({"priority": {"weight_qos": 5000}}))
    shown = JobService(store, config, log_dir=tmp_path).standing.priority(Caller(uid=0, gid=0))["weights"]
    assert shown == {"fair_share": 10000.0, "qos": 5000, "age": 0.0, "job_size": 0.0}
