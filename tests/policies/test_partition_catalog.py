"""The partition catalog (policies/data/partitions.toml): every entry names its public
source, every part is a catalog part, and the profiles are consistent with their GPU."""

from __future__ import annotations

import pytest

from policies.model.catalog import catalog
from policies.model.partitions import (
    amd_partition_fraction,
    amd_parts,
    known_mig_profiles,
    mig_parts,
    mig_profile,
    normal_profile,
    profile_from_slices,
)


def test_every_entry_names_its_source():
    entries = list(mig_parts().values()) + list(amd_parts().values())
    assert len(entries) >= 12
    for e in entries:
        assert e.source.strip() and ("http" in e.source), f"{e.model}: no source"


def test_every_partitioned_part_is_a_catalog_part():
    for model in list(mig_parts()) + list(amd_parts()):
        assert model in catalog(), model


@pytest.mark.parametrize("model", ["A100", "A100-40GB", "H100", "H200", "B200"])
def test_mig_profiles_fit_their_gpu_and_name_their_memory(model):
    part = mig_parts()[model]
    gb = catalog()[model].memory_gib
    assert part.profiles[-1].compute_slices == part.compute_slices == 7
    for p in part.profiles:
        assert 1 <= p.compute_slices <= part.compute_slices
        assert 1 <= p.memory_slices <= part.memory_slices
        assert p.max_instances * p.compute_slices <= part.compute_slices
        named_gb = int(p.name.split(".")[1].removesuffix("gb"))
        # NVIDIA names a profile by its memory share of the card, in whole GB (some round down)
        assert abs(named_gb - gb * p.memory_slices / part.memory_slices) <= 1.5, (model, p.name)


def test_h100_has_the_seven_way_split_and_fractions_by_compute():
    p = mig_profile("H100", "1g.10gb")
    assert p is not None and p.max_instances == 7 and p.fraction == pytest.approx(1 / 7)
    assert mig_profile("H100", "MIG 3g.40gb").fraction == pytest.approx(3 / 7)
    assert mig_profile("H100", "1g.10gb+me").compute_slices == 1
    assert mig_profile("H100", "1g.5gb") is None
    assert {"1g.10gb", "7g.80gb", "1g.18gb", "7g.180gb", "1g.5gb"} <= known_mig_profiles()


def test_profile_names_are_normalised_and_garbage_refused():
    assert normal_profile("MIG 1g.10gb") == "1g.10gb"
    assert normal_profile("1G.10GB+ME") == "1g.10gb+me"
    assert normal_profile("10gb") is None and normal_profile("1g") is None


def test_a_mig_device_is_named_from_its_slices_and_memory():
    # H100 80GB: an instance of 1 compute slice with ~10 GB is 1g.10gb, with ~20 GB 1g.20gb
    assert profile_from_slices("H100", 1, 9984, 81559) == "1g.10gb"
    assert profile_from_slices("H100", 1, 19968, 81559) == "1g.20gb"
    assert profile_from_slices("H100", 3, 40192, 81559) == "3g.40gb"
    assert profile_from_slices(None, 2, 12288, None) == "2g.12gb"


def test_amd_partition_modes_and_their_shares():
    mi300x = amd_parts()["MI300X"]
    assert mi300x.compute_modes == {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
    assert "NPS4" in mi300x.memory_modes
    assert amd_partition_fraction("QPX", 4) == 0.25
    assert amd_partition_fraction("SPX", 1) == amd_partition_fraction(None, 1) == 1.0
