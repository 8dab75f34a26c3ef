"""The catalog's embodied carbon (policies/data/catalog.toml [MODEL.embodied]): every figure
carries its source, estimates their method, and nothing in planning reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.model.catalog import catalog
from policies.model.embodied import DEFAULT_LIFETIME_YEARS, HOURS_PER_YEAR, parse_embodied

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def test_every_catalog_entry_has_a_source_for_each_embodied_figure():
    for name, spec in catalog().items():
        e = spec.embodied
        assert e.gpu_basis in ("published", "estimated", "unknown"), name
        assert e.gpu_source.strip(), f"{name}: the GPU figure (or why there is none) needs its source"
        assert e.lifetime_years > 0 and e.lifetime_source.strip(), name
        if e.gpu_kgco2e is None:
            assert e.gpu_basis == "unknown", name
        if e.host_kgco2e is not None:
            assert e.host_basis in ("published", "estimated") and e.host_source.strip(), name
        if "estimated" in (e.gpu_basis, e.host_basis):
            assert e.method.strip(), f"{name}: an estimate needs its method"


def test_the_published_figures_are_the_ones_their_sources_give():
    c = catalog()
    assert c["H100"].embodied.gpu_kgco2e == pytest.approx(1312 / 8)  # HGX H100 PCF, per 8-GPU board
    assert c["B200"].embodied.gpu_kgco2e == pytest.approx(2274 / 8)  # HGX B200 PCF, per 8-GPU system
    assert c["A100"].embodied.gpu_kgco2e == 143.0  # Boavizta, as EcoLogits uses it
    assert c["H100"].embodied.host_kgco2e == pytest.approx(5700 / 8)
    assert c["A100"].embodied.host_kgco2e == pytest.approx(3000 / 8)
    for name in ("H100", "B200", "A100"):
        assert c[name].embodied.gpu_basis == "published"


def test_the_parts_without_a_public_figure_are_estimated_or_unknown():
    c = catalog()
    for name in ("MI300X", "MI325X", "MI355X", "H200"):
        assert c[name].embodied.gpu_basis in ("estimated", "unknown"), name
    # the H200 estimate: same 814 mm2 die, 6 HBM stacks against 5: 164 x (1 + 6/5) / 2
    assert c["H200"].embodied.gpu_kgco2e == pytest.approx(164 * (1 + 6 / 5) / 2)
    assert c["MI300X"].embodied.gpu_kgco2e == pytest.approx(164 * (2400 / 814 + 8 / 5) / 2, abs=0.5)
    assert c["H100-PCIe"].embodied.gpu_kgco2e is None and c["H100-PCIe"].embodied.g_per_gpu_hour() is None


def test_one_gpu_hour_carries_the_figure_over_the_lifetime_in_hours():
    e = catalog()["H100"].embodied
    assert e.lifetime_years == DEFAULT_LIFETIME_YEARS == 5.0
    assert e.g_per_gpu_hour("gpu") == pytest.approx(164.0 * 1000 / (5 * HOURS_PER_YEAR))
    assert e.g_per_gpu_hour("host") == pytest.approx(712.5 * 1000 / (5 * HOURS_PER_YEAR))
    assert e.g_per_gpu_hour() == pytest.approx((164.0 + 712.5) * 1000 / (5 * HOURS_PER_YEAR))


@pytest.mark.parametrize("table, why", [
    ({"gpu_kgco2e": 100.0, "gpu_basis": "published", "gpu_source": " "}, "positive figure and its source"),
    ({"gpu_kgco2e": 100.0, "gpu_basis": "estimated", "gpu_source": "x"}, "needs its method"),
    ({"gpu_kgco2e": 100.0, "gpu_basis": "unknown", "gpu_source": "x"}, "go together"),
    ({"gpu_basis": "unknown", "gpu_source": ""}, "gpu_source is required"),
    ({"gpu_kgco2e": 1.0, "gpu_basis": "published", "gpu_source": "x", "host_kgco2e": 5.0,
      "host_basis": "published"}, "positive figure and its source"),
    ({"gpu_kgco2e": 1.0, "gpu_basis": "published", "gpu_source": "x", "lifetime_years": 6}, "lifetime_source"),
    ({"gpu_kgco2e": 1.0, "gpu_basis": "guessed", "gpu_source": "x"}, "one of"),
    ({"gpu_kgco2e": 1.0, "gpu_basis": "published", "gpu_source": "x", "co2": 1}, "unknown key"),
])
def test_a_figure_without_its_source_or_method_is_refused(table, why):
    with pytest.raises(ValueError, match=why):
        parse_embodied("X", table)


def test_planning_never_reads_embodied_carbon():
    """Embodied carbon is sunk once the GPU is bought: placement must not price it (the
    catalog module says why). Only the catalog and the embodied module mention it."""
    readers = [p.relative_to(POLICIES).as_posix() for p in POLICIES.rglob("*.py")
               if "embodied" in p.read_text("utf-8")]
    assert sorted(readers) == ["model/catalog.py", "model/embodied.py"]
    assert "Sunk Carbon Fallacy" in " ".join((POLICIES / "model" / "catalog.py").read_text("utf-8").split())
