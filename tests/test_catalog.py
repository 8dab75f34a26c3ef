"""policies.catalog: the hardware catalog, fleet specs (`4xMI300X,2xH100`) and vendor names."""

from __future__ import annotations

import pytest

from policies.catalog import GpuModel, catalog, lookup, match_device_name, parse_fleet

MODELS = ["MI300X", "MI325X", "MI355X", "A100", "H100", "H200", "B200"]


# -- the catalog ----------------------------------------------------------------------------

def test_catalog_knows_every_supported_amd_and_nvidia_model():
    assert set(catalog()) == set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_every_catalog_entry_is_physically_plausible(name):
    m = catalog()[name]
    assert m.name == name
    assert m.vendor in {"amd", "nvidia"}
    assert m.vendor == ("amd" if name.startswith("MI") else "nvidia")
    assert 40 <= m.memory_gib <= 512
    assert 0 < m.idle_w < m.tdp_w <= 2000
    assert m.hbm_tb_per_s > 0 and m.bf16_dense_tflops > 0 and m.list_price_usd > 0


@pytest.mark.parametrize(("name", "memory_gib", "tdp_w"),
                         [("MI300X", 192, 750), ("H100", 80, 700), ("H200", 141, 700),
                          ("MI355X", 288, 1400), ("B200", 180, 1000)])
def test_catalog_values_match_vendor_data_sheets(name, memory_gib, tdp_w):
    assert catalog()[name].memory_gib == memory_gib
    assert catalog()[name].tdp_w == tdp_w


def test_lookup_is_case_insensitive_and_ignores_blanks():
    assert lookup(" mi300x ") is catalog()["MI300X"]
    assert lookup("h100").name == "H100"


def test_lookup_of_unknown_model_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        lookup("RTX4090")
    assert "RTX4090" in str(err.value)
    for name in MODELS:
        assert name in str(err.value)


# -- parse_fleet ----------------------------------------------------------------------------

def names(fleet: list[GpuModel]) -> list[str]:
    return [m.name for m in fleet]


def test_parse_fleet_expands_counts_in_order():
    assert names(parse_fleet("4xMI300X,2xH100")) == ["MI300X"] * 4 + ["H100"] * 2


def test_parse_fleet_returns_catalog_entries():
    fleet = parse_fleet("2xH200")
    assert all(m is catalog()["H200"] for m in fleet)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("MI300X", ["MI300X"]),  # a count of one may be left out
        ("1xB200", ["B200"]),
        ("2XH100", ["H100", "H100"]),  # X or x
        ("2 x h100", ["H100", "H100"]),  # blanks and case do not matter
        (" 1xA100 , 1xMI355X ", ["A100", "MI355X"]),
        ("8xMI325X", ["MI325X"] * 8),
        ("1xH100,1xH100", ["H100", "H100"]),  # a model may appear twice
    ],
)
def test_parse_fleet_accepts_reasonable_spellings(spec, expected):
    assert names(parse_fleet(spec)) == expected


@pytest.mark.parametrize(
    "spec",
    ["", "   ", ",", "4xMI300X,", ",2xH100", "4xMI300X,,2xH100", "4*MI300X", "-1xH100",
     "4 MI300X", "4xMI300X;2xH100", "x4H100", "2.5xH100"],
)
def test_parse_fleet_rejects_bad_syntax(spec):
    with pytest.raises(ValueError):
        parse_fleet(spec)


@pytest.mark.parametrize("spec", ["0xH100", "2xMI300X,0xH100", "1025xH100", "00xB200"])
def test_parse_fleet_rejects_zero_and_absurd_counts(spec):
    with pytest.raises(ValueError) as err:
        parse_fleet(spec)
    assert "between 1 and 1024" in str(err.value)


@pytest.mark.parametrize("spec", ["4xMI250X", "2xH100,1xRTX4090", "1xV100", "2xGB200"])
def test_parse_fleet_rejects_unknown_models_naming_them(spec):
    with pytest.raises(ValueError) as err:
        parse_fleet(spec)
    assert "unknown GPU model" in str(err.value)


def test_parse_fleet_error_quotes_the_offending_part():
    with pytest.raises(ValueError) as err:
        parse_fleet("2xH100,4*MI300X")
    assert "'4*MI300X'" in str(err.value)


# -- match_device_name ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("device_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("amd instinct mi300x", "MI300X"),  # case does not matter
    ],
)
def test_match_device_name_maps_vendor_marketing_names_to_models(device_name, model):
    found = match_device_name(device_name)
    assert found is not None, device_name
    assert found.name == model


@pytest.mark.parametrize(
    "device_name",
    [
        "NVIDIA GeForce RTX 4090",
        "Tesla V100-SXM2-32GB",
        "AMD Instinct MI250X",
        "AMD Instinct MI300A",  # an APU, not the MI300X
        "NVIDIA GB200",  # a superchip name must not match B200 inside it
        "NVIDIA H1000",  # a longer number is a different part
        "NVIDIA HA100",
        "",
    ],
)
def test_match_device_name_returns_none_for_unknown_devices(device_name):
    assert match_device_name(device_name) is None
