"""policies.model.catalog: the hardware catalog, fleet specs (`4xMI300X,2xH100`) and vendor names."""

from __future__ import annotations

import pytest

from policies.model.catalog import GpuModel, catalog, lookup, match_device_name, nominal_memory_gib, parse_fleet

MODELS = ["MI300X", "MI325X", "MI355X", "MI300A", "A100", "A100-40GB", "A100-PCIe", "H100", "H100-PCIe",
          "H100-NVL", "GH200", "H200", "H200-NVL", "B200"]


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
                          ("MI355X", 288, 1400), ("B200", 180, 1000), ("H100-PCIe", 80, 350),
                          ("H100-NVL", 94, 400), ("A100-40GB", 40, 400), ("A100-PCIe", 80, 300),
                          ("H200-NVL", 141, 600), ("MI300A", 128, 550)])
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
        # NVIDIA: nvmlDeviceGetName as nvidia-smi prints it
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA B200", "B200"),
        # AMD: amdsmi market_name
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),  # SR-IOV virtual function of the same part
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("AMD Instinct MI300A", "MI300A"),
        ("amd instinct mi300x", "MI300X"),  # case does not matter
        ("  NVIDIA  H100 PCIe ", "H100-PCIe"),  # nor blanks
        ("MI300X", "MI300X"),  # the emulated backend uses catalog names
    ],
)
def test_match_device_name_maps_what_real_drivers_print_to_its_own_catalog_row(device_name, model):
    found = match_device_name(device_name)
    assert found is not None, device_name
    assert found.name == model


@pytest.mark.parametrize(
    "device_name",
    [
        "NVIDIA GeForce RTX 4090",
        "Tesla V100-SXM2-32GB",
        "AMD Instinct MI250X",
        "NVIDIA H800",  # an export variant: not the H100
        "NVIDIA H100 80GB HBM3e",  # a name that merely contains a known one
        "NVIDIA GB200",  # a superchip name must not match B200 inside it
        "NVIDIA H1000",  # a longer number is a different part
        "NVIDIA HA100",
        "",
    ],
)
def test_match_device_name_returns_none_for_unknown_devices(device_name):
    assert match_device_name(device_name) is None


def test_variants_have_their_own_tdp_memory_and_bandwidth():
    sxm, pcie, nvl = catalog()["H100"], catalog()["H100-PCIe"], catalog()["H100-NVL"]
    assert pcie.tdp_w < sxm.tdp_w and pcie.hbm_tb_per_s < sxm.hbm_tb_per_s
    assert nvl.memory_gib == 94 and nvl.tdp_w == 400
    assert catalog()["A100-40GB"].memory_gib == 40 and catalog()["A100"].memory_gib == 80


def test_every_driver_name_denotes_exactly_one_part():
    seen = {}
    for spec in catalog().values():
        for name in spec.driver_names:
            assert match_device_name(name) is spec
            assert name.upper() not in seen, (name, seen.get(name.upper()))
            seen[name.upper()] = spec.name


# -- nominal memory: what --gpu-mem (GiB) is matched against --------------------------------

@pytest.mark.parametrize(("driver_name", "reported_mib", "nominal_gib"), [
    ("NVIDIA H100 80GB HBM3", 81559, 80),     # nvidia-smi (NVIDIA/nccl#1264)
    ("NVIDIA A100-SXM4-80GB", 81920, 80),     # modal-labs/modal-client#2797
    ("NVIDIA A100-SXM4-40GB", 40960, 40),     # same
    ("NVIDIA H100 NVL", 95330, 94),           # 99961274368 B (fastfetch-cli/fastfetch#1658)
    ("NVIDIA B200", 183359, 180),             # NVIDIA/TensorRT-LLM#10278
    ("AMD Instinct MI300X", 196592, 192),     # 8 x the CPX partition's bank (ROCm/legacy-rocm-build#4750)
])
def test_a_catalog_part_offers_its_data_sheet_capacity_not_the_drivers_smaller_figure(
        driver_name, reported_mib, nominal_gib):
    reported_gib = reported_mib / 1024
    assert reported_gib <= nominal_gib  # what the driver says would refuse --gpu-mem NOMINAL
    assert nominal_memory_gib(match_device_name(driver_name), reported_gib) == nominal_gib


def test_an_unknown_part_offers_what_its_driver_reports_rounded_up_to_a_whole_gib():
    assert nominal_memory_gib(None, 79.65) == 80
    assert nominal_memory_gib(None, 40.0) == 40


def test_a_compute_partition_offers_its_share_of_the_card():
    assert nominal_memory_gib(catalog()["MI300X"], 24.0, partitions=8) == 24
    assert nominal_memory_gib(catalog()["MI300X"], 96.0, partitions=2) == 96
