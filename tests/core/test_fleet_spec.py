"""The emulated fleet spec (`--emulate`): MIG layouts and AMD compute and memory partitions
after a colon, each checked against the partition catalog; a bad one is refused naming it."""

from __future__ import annotations

import pytest

from scheduler.fleet_spec import parse_emulated_fleet
from scheduler.settings import SETTINGS


def test_plain_parts_are_whole_gpus_as_before():
    models = parse_emulated_fleet("2xMI300X,1xH100")
    assert [(m.model, m.mig, m.partitions) for m in models] == [("MI300X", (), 1)] * 2 + [("H100", (), 1)]


def test_a_mig_layout_gives_each_instance_its_slices_and_memory():
    (h100,) = parse_emulated_fleet("1xH100:mig=3g.40gb+2g.20gb+1g.10gb*2")
    assert h100.mig == ((3, 40960.0), (2, 20480.0), (1, 10240.0), (1, 10240.0))
    assert len(parse_emulated_fleet("2xH100:mig=1g.10gb*7")) == 2


def test_an_amd_partition_mode_splits_each_card_with_its_share_of_power_and_memory():
    parts = parse_emulated_fleet("1xMI300X:partition=CPX:nps=NPS4")
    assert len(parts) == 8
    assert {(p.partition_mode, p.partitions, p.memory_gib, p.tdp_w, p.memory_partition) for p in parts} == \
        {("CPX", 8, 24.0, 93.75, "NPS4")}


@pytest.mark.parametrize("spec, words", [
    ("1xH100:mig=1g.10gb*8", "1 to 7 1g.10gb instances"),
    ("1xH100:mig=4g.40gb+4g.40gb", "more than one GPU has"),
    ("1xH100:mig=1g.5gb", "not a MIG profile of H100"),
    ("1xMI300X:mig=1g.10gb", "no MIG profiles"),
    ("1xH100:partition=CPX", "no compute partition mode CPX"),
    ("1xMI300X:nps=NPS2", "no memory partition mode NPS2"),
    ("1xH100:share=4", "bad option"),
])
def test_a_layout_the_part_cannot_have_is_refused_naming_it(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_emulated_fleet(spec)


def test_the_settings_check_layouts_and_bound_the_declared_shares():
    by_key = {s.key: s for s in SETTINGS}
    assert by_key["emulate"].parse("1xH100:mig=1g.10gb*7") == "1xH100:mig=1g.10gb*7"
    with pytest.raises(ValueError, match="more than one GPU has"):
        by_key["emulate"].parse("1xH100:mig=7g.80gb+1g.10gb")
    assert by_key["gpu_shares"].default == 1 and by_key["gpu_shares"].parse(4) == 4
    with pytest.raises(ValueError):
        by_key["gpu_shares"].parse(0)
