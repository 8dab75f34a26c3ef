"""Embodied carbon of a GPU model: what making the card (and its share of the host server)
emitted, where each figure comes from, and the share of it a run of some GPU-hours carries.

A run's embodied carbon is its GPU-hours over the GPU's lifetime in hours, times the
embodied kgCO2e per GPU (the GPU's own figure, plus the host server's share per GPU where a
figure exists):

    embodied gCO2e = GPU-hours / (lifetime_years x 8766 h) x (gpu_kgco2e + host_kgco2e) x 1000

the Software Carbon Intensity specification's M = TE x (TiR / EL) x (RR / ToR), with the
time reserved TiR the run's duration and the resources reserved RR its GPUs. Each figure is
labelled by its `basis`: "published" (a vendor product carbon footprint or a published LCA
dataset), "estimated" (scaled by this project from a published figure, the method stated in
`method`) or "unknown" (no figure: receipts and reports say unknown, never zero). See
policies/data/catalog.toml for the figures and their sources, and `policies.model.catalog`
for why none of this is used for placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: Hours in a year (365.25 days), the one conversion of a lifetime in years to hours.
HOURS_PER_YEAR = 8766.0

#: The lifetime a GPU's embodied carbon is spread over when the catalog names none for it.
DEFAULT_LIFETIME_YEARS = 5.0
DEFAULT_LIFETIME_SOURCE = (
    "default 5 years: the hardware lifespan EcoLogits amortizes its A100 server and GPU figures over "
    "(genai-impact/ecologits, ecologits/impacts/llm.py, HARDWARE_LIFESPAN = 5 years), and the useful life "
    "Amazon set for its AI-era servers from 2025 (Form 10-K for 2024: a subset of servers and networking "
    "equipment from six years to five); Microsoft and Alphabet depreciate servers over 6 years. The SCI "
    "specification leaves the expected lifespan to the operator: set lifetime_years per model to your own "
    "depreciation or refresh cycle")

BASES = ("published", "estimated", "unknown")


@dataclass(frozen=True)
class Embodied:
    """The embodied carbon of one GPU model, each figure with its basis and source.

    gpu_kgco2e: the card's own cradle-to-gate kgCO2e (None: unknown); host_kgco2e: the host
    server's kgCO2e per GPU it holds, GPUs excluded (None: unknown); lifetime_years: what
    both are spread over.
    """

    gpu_kgco2e: float | None
    gpu_basis: str
    gpu_source: str
    host_kgco2e: float | None = None
    host_basis: str = "unknown"
    host_source: str = ""
    method: str = ""  # how an estimated figure was made (the arithmetic and its facts)
    lifetime_years: float = DEFAULT_LIFETIME_YEARS
    lifetime_source: str = DEFAULT_LIFETIME_SOURCE

    @property
    def known(self) -> bool:
        return self.gpu_kgco2e is not None

    @property
    def kgco2e_per_gpu(self) -> float | None:
        """The GPU's figure plus the host share where known; None where the GPU's is unknown."""
        if self.gpu_kgco2e is None:
            return None
        return self.gpu_kgco2e + (self.host_kgco2e or 0.0)

    def g_per_gpu_hour(self, part: str = "all") -> float | None:
        """Grams of embodied carbon one GPU-hour carries: `part` "gpu", "host" or "all" (both,
        the host share where known); None where that part is unknown."""
        kg = {"gpu": self.gpu_kgco2e, "host": self.host_kgco2e, "all": self.kgco2e_per_gpu}[part]
        if kg is None:
            return None
        return kg * 1000.0 / (self.lifetime_years * HOURS_PER_YEAR)


def unknown_embodied(why: str) -> Embodied:
    """The embodied figures of a part without any: unknown, with why."""
    return Embodied(gpu_kgco2e=None, gpu_basis="unknown", gpu_source=why)


def parse_embodied(model: str, table: Mapping[str, Any] | None) -> Embodied:
    """The `[MODEL.embodied]` table of catalog.toml as an Embodied; a model without one is
    unknown. Refuses a figure without its source or basis, and an unknown figure with one."""
    if not table:
        return unknown_embodied("no embodied figure in the catalog for this part")
    fields = dict(table)
    unknown = sorted(set(fields) - {"gpu_kgco2e", "gpu_basis", "gpu_source", "host_kgco2e", "host_basis",
                                    "host_source", "method", "lifetime_years", "lifetime_source"})
    if unknown:
        raise ValueError(f"catalog {model}.embodied: unknown key(s) {', '.join(unknown)}")
    if "lifetime_years" in fields and "lifetime_source" not in fields:
        raise ValueError(f"catalog {model}.embodied: lifetime_years needs its lifetime_source")
    fields.setdefault("gpu_kgco2e", None)
    fields.setdefault("gpu_basis", "unknown")
    fields.setdefault("gpu_source", "")
    e = Embodied(**fields)
    for part, kg, basis, source in (("gpu", e.gpu_kgco2e, e.gpu_basis, e.gpu_source),
                                    ("host", e.host_kgco2e, e.host_basis, e.host_source)):
        if basis not in BASES:
            raise ValueError(f"catalog {model}.embodied: {part}_basis {basis!r}: one of {', '.join(BASES)}")
        if (kg is None) != (basis == "unknown"):
            raise ValueError(f"catalog {model}.embodied: {part}_kgco2e and {part}_basis 'unknown' go together")
        if kg is not None and (kg <= 0 or not source.strip()):
            raise ValueError(f"catalog {model}.embodied: {part}_kgco2e needs a positive figure and its source")
    if not e.gpu_source.strip():
        raise ValueError(f"catalog {model}.embodied: gpu_source is required, also for an unknown figure (why)")
    if "estimated" in (e.gpu_basis, e.host_basis) and not e.method.strip():
        raise ValueError(f"catalog {model}.embodied: an estimated figure needs its method")
    if e.lifetime_years <= 0 or not e.lifetime_source.strip():
        raise ValueError(f"catalog {model}.embodied: lifetime_years needs a positive value and its source")
    return e
