"""scheduler.qos: the three levels every install has, and the config's `[qos.NAME]` tables
over them, each mistake one line naming the level and the key."""

from __future__ import annotations

import pytest

from scheduler.qos import BUILT_IN, DEFAULT_QOS, QosConfigError, QosTable, check_qos_config, qos_table


def test_urgent_normal_and_flexible_exist_without_configuration_and_normal_is_the_default():
    table = qos_table({})
    assert table.names() == ["flexible", "normal", "urgent"]
    assert DEFAULT_QOS == "normal" and table.get(None).name == "normal"
    urgent, normal, flexible = (table.get(n) for n in ("urgent", "normal", "flexible"))
    assert urgent.defer == "urgent" and urgent.max_defer_s is None
    assert normal.defer == "normal" and 0 < normal.max_defer_s < float("inf")
    assert flexible.defer == "flexible"
    assert urgent.priority > normal.priority > flexible.priority
    assert flexible.usage_factor < normal.usage_factor <= urgent.usage_factor  # deferral is charged less
    # a few seconds' job (~0.4 g on an H100) can never save what normal waits for
    assert normal.min_saving_g > 0.4 and normal.min_saving_pct > flexible.min_saving_pct


def test_a_table_changes_only_the_fields_it_sets_and_a_new_level_starts_from_normal():
    table = qos_table({"qos": {"urgent": {"max_jobs_queued_per_user": 5},
                               "debug": {"priority": 50, "defer": "urgent", "max_time_limit": "30m"}}})
    assert table.get("urgent") == BUILT_IN["urgent"].__class__(**{**BUILT_IN["urgent"].as_json(),
                                                                  "max_jobs_queued_per_user": 5})
    debug = table.get("debug")
    assert (debug.priority, debug.defer, debug.max_time_limit_s, debug.max_defer_s) == (50, "urgent", 1800.0, None)
    assert debug.usage_factor == BUILT_IN["normal"].usage_factor


def test_a_jobs_default_limit_is_its_qos_default_else_the_sites_capped_at_the_maximum():
    table = qos_table({"qos": {"a": {"default_time_limit": "10m"}, "b": {"max_time_limit": "1h"}}})
    assert table.get("a").time_limit_for(86400.0) == 600.0
    assert table.get("b").time_limit_for(86400.0) == 3600.0
    assert table.get("normal").time_limit_for(86400.0) == 86400.0


def test_an_unknown_level_names_the_known_ones():
    with pytest.raises(KeyError) as e:
        QosTable().get("gold")
    assert e.value.args[0] == "unknown QOS 'gold'; known: flexible, normal, urgent"


@pytest.mark.parametrize("config, words", [
    ({"qos": {"urgent": {"priority": -1}}}, "urgent: priority: must be a whole number"),
    ({"qos": {"x": {"defer": "later"}}}, "x: defer: must be one of urgent, normal, flexible"),
    ({"qos": {"x": {"usage_factor": "cheap"}}}, "x: usage_factor: must be a number"),
    ({"qos": {"x": {"min_saving_pct": 150}}}, "x: min_saving_pct: must be a number from 0 to 100"),
    ({"qos": {"x": {"max_time_limit": "40d"}}}, "x: max_time_limit: must be a duration from 1s to 30d"),
    ({"qos": {"x": {"max_defer": "1h", "defer": "urgent"}}}, "x: max_defer: only a defer = \"normal\" level"),
    ({"qos": {"x": {"default_time_limit": "2h", "max_time_limit": "1h"}}}, "above max_time_limit 1h"),
    ({"qos": {"x": {"colour": "red"}}}, "x: unknown key(s) colour"),
    ({"qos": {"Gold": {}}}, "Gold: a QOS name is lower-case"),
    ({"qos": {"x": 3}}, "must be a table of settings"),
])
def test_each_mistake_is_one_line_naming_the_level_and_key(config, words):
    errors = check_qos_config(config["qos"], config)
    assert len(errors) == 1 and words in errors[0], errors
    with pytest.raises(QosConfigError):
        qos_table(config)


def test_the_table_gives_priorities_and_usage_factors_by_name_for_priority_and_fair_share():
    table = qos_table({"qos": {"debug": {"priority": 50, "usage_factor": 2.0}}})
    assert table.priorities() == {"urgent": 100, "normal": 10, "flexible": 0, "debug": 50}
    assert table.usage_factors() == {"urgent": 1.5, "normal": 1.0, "flexible": 0.5, "debug": 2.0}
