"""The hardware catalog: what each GPU model is, from vendor data sheets."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources


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


@cache
def catalog() -> dict[str, GpuModel]:
    """All known GPU models by canonical name (e.g. "MI300X", "H100")."""
    text = resources.files("policies").joinpath("data/catalog.toml").read_text("utf-8")
    return {name: GpuModel(name=name, **fields) for name, fields in tomllib.loads(text).items()}


@cache
def _by_lower_name() -> dict[str, GpuModel]:
    return {name.lower(): spec for name, spec in catalog().items()}


def lookup(model: str) -> GpuModel:
    """Find a model by name, case-insensitively; ValueError lists the known names."""
    spec = _by_lower_name().get(model.strip().lower())
    if spec is None:
        raise ValueError(f"unknown GPU model {model!r}; known: {', '.join(catalog())}")
    return spec


def match_device_name(device_name: str) -> GpuModel | None:
    """Map a vendor's marketing name ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X") to a model."""
    upper = device_name.upper()
    for name in sorted(catalog(), key=len, reverse=True):
        if re.search(rf"(?<![A-Z0-9]){re.escape(name)}(?![0-9])", upper):
            return catalog()[name]
    return None


_SPEC_PART = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9]+)\s*$")


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
