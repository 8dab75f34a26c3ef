"""The hardware catalog: what each GPU model is, from vendor data sheets, and what making it
emitted (its embodied carbon, `policies.model.embodied`), each figure with its source.

Embodied carbon is shown on receipts, reports, exports and metrics, beside the operational
carbon and never added into it silently; it is NOT used for placement, by default or
otherwise. Once a GPU is bought, its manufacturing emissions are sunk: no placement decision
changes them, and charging each run a share of them makes a planner prefer newer, "cleaner
per hour" or idle hardware for reasons that do not reduce what is emitted. The "Sunk Carbon
Fallacy" (arXiv 2410.15087) shows that putting embodied carbon into scheduling and
placement decisions this way can raise total emissions. Embodied carbon belongs in
accounting (what a job is charged, what a site discloses) and in procurement, where it can
still be avoided; placement prices the operational carbon that is still to be emitted.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from policies.model.embodied import Embodied, parse_embodied, unknown_embodied


@dataclass(frozen=True)
class GpuModel:
    name: str
    vendor: str
    memory_gib: float
    hbm_tb_per_s: float
    bf16_dense_tflops: float
    tdp_w: float
    idle_w: float
    list_price_usd: float
    fp8_dense_tflops: float = 0.0  # 0: no FP8 tensor cores (A100)
    source: str = ""  # the data sheet the figures come from
    driver_names: tuple[str, ...] = ()  # what the drivers print for this part (see catalog.toml)
    # embodied carbon with the source of each figure (catalog.toml [MODEL.embodied]); accounting only
    embodied: Embodied = unknown_embodied("no embodied figure in the catalog for this part")


@cache
def catalog() -> dict[str, GpuModel]:
    """All known GPU models by canonical name (e.g. "MI300X", "H100")."""
    text = resources.files("policies").joinpath("data/catalog.toml").read_text("utf-8")
    out = {}
    for name, fields in tomllib.loads(text).items():
        fields["driver_names"] = tuple(fields.get("driver_names", ()))
        fields["embodied"] = parse_embodied(name, fields.get("embodied"))
        out[name] = GpuModel(name=name, **fields)
    return out


@cache
def _by_lower_name() -> dict[str, GpuModel]:
    return {name.lower(): spec for name, spec in catalog().items()}


def lookup(model: str) -> GpuModel:
    """Find a model by name, case-insensitively; ValueError lists the known names."""
    spec = _by_lower_name().get(model.strip().lower())
    if spec is None:
        raise ValueError(f"unknown GPU model {model!r}; known: {', '.join(catalog())}")
    return spec


_VENDOR_PREFIX = re.compile(r"^(?:NVIDIA\s+|AMD\s+)?(?:INSTINCT\s+)?")


def _driver_key(name: str) -> str:
    """A driver's name for matching: upper case, blanks collapsed, vendor prefixes dropped."""
    return _VENDOR_PREFIX.sub("", " ".join(name.upper().split()))


@cache
def _by_driver_name() -> dict[str, GpuModel]:
    table: dict[str, GpuModel] = {}
    for spec in catalog().values():
        for alias in (spec.name, *spec.driver_names):
            key = _driver_key(alias)
            if key in table and table[key] is not spec:
                raise ValueError(f"catalog: driver name {alias!r} is claimed by {table[key].name} "
                                 f"and {spec.name}")
            table[key] = spec
    return table


def match_device_name(device_name: str) -> GpuModel | None:
    """The catalog part a driver's name denotes, or None for a part the catalog does not know.

    Only exact names count (a row's own name or one of its `driver_names`, without vendor
    prefixes, case-insensitively): "NVIDIA H100 80GB HBM3" is the H100 (SXM), "NVIDIA H100
    PCIe" the H100-PCIe, "AMD Instinct MI300X VF" the MI300X. A name merely containing a
    known one ("NVIDIA H100 XYZ") is unknown: planning it as another part would be wrong.
    """
    return _by_driver_name().get(_driver_key(device_name))


def nominal_memory_gib(spec: GpuModel | None, reported_gib: float, partitions: int = 1) -> float:
    """The capacity `submit --gpu-mem` (GiB) is matched against, for one GPU or partition.

    A catalog part: its data-sheet capacity (memory_gib), divided among the compute
    partitions of its card. Drivers report a little less than the data sheet (an H100 80GB
    shows 81,559 MiB = 79.6 GiB; the rest is reserved), so the reported figure would refuse
    `--gpu-mem 80` on an 80 GB card. An unknown part: the reported figure rounded up to a
    whole GiB (no data sheet to go by; at most 1 GiB above what the driver reports).
    """
    if spec is not None:
        return round(spec.memory_gib / max(1, partitions), 2)
    return float(math.ceil(round(reported_gib, 2)))


_SPEC_PART = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9][A-Za-z0-9-]*)\s*$")


def parse_fleet(spec: str) -> list[GpuModel]:
    """Parse a fleet spec like "4xMI300X,2xH100" into one GpuModel per GPU, in order.

    Raises ValueError with the offending part on bad syntax, zero counts or unknown models.
    """
    if not spec or not spec.strip():
        raise ValueError("empty GPU fleet spec; expected e.g. 4xMI300X,2xH100")
    gpus: list[GpuModel] = []
    for part in spec.split(","):
        m = _SPEC_PART.match(part)
        if not m:
            raise ValueError(f"bad GPU fleet part {part.strip()!r}; expected COUNTxMODEL, e.g. 4xMI300X")
        count = int(m.group(1) or 1)
        if not 1 <= count <= 1024:
            raise ValueError(f"GPU count in {part.strip()!r} must be between 1 and 1024")
        gpus.extend([lookup(m.group(2))] * count)
    return gpus
