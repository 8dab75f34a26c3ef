"""How GPUs split into slices (policies/data/partitions.toml): NVIDIA MIG profiles per part
and AMD compute and memory partition modes per part, each with its public source.

A slice's share of its GPU is what `submit --gpu-fraction` is compared with: a MIG profile's
compute slices over the GPU's (1g of 7 = 0.143), an AMD compute partition's 1 / partitions
(QPX = 0.25), a declared time-sliced share's 1 / shares.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

# A MIG profile name as NVML and nvidia-smi print it ("MIG 1g.10gb", "1g.10gb+me").
_PROFILE = re.compile(r"^(?:MIG\s+)?(\d+)g\.(\d+)gb((?:[+-]\w+)*)$", re.IGNORECASE)


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of a part."""

    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int
    gpu_compute_slices: int
    gpu_memory_slices: int

    @property
    def fraction(self) -> float:
        """The profile's share of the GPU's compute."""
        return self.compute_slices / self.gpu_compute_slices


@dataclass(frozen=True)
class MigPart:
    model: str
    source: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]


@dataclass(frozen=True)
class AmdPartitioning:
    model: str
    source: str
    compute_modes: dict[str, int]
    memory_modes: tuple[str, ...]


@cache
def _data() -> dict:
    text = resources.files("policies").joinpath("data/partitions.toml").read_text("utf-8")
    return tomllib.loads(text)


@cache
def mig_parts() -> dict[str, MigPart]:
    """The MIG-capable parts by catalog name."""
    out = {}
    for model, t in _data().get("mig", {}).items():
        profiles = tuple(MigProfile(p["name"], p["compute"], p["memory"], p["max"],
                                    t["compute_slices"], t["memory_slices"]) for p in t["profiles"])
        out[model] = MigPart(model, t["source"], t["compute_slices"], t["memory_slices"], profiles)
    return out


@cache
def amd_parts() -> dict[str, AmdPartitioning]:
    """The partitionable AMD parts by catalog name."""
    return {model: AmdPartitioning(model, t["source"], dict(t["compute_modes"]),
                                   tuple(t["memory_modes"]))
            for model, t in _data().get("amd", {}).items()}


def known_mig_profiles() -> set[str]:
    """Every MIG profile name of every catalogued part."""
    return {p.name for part in mig_parts().values() for p in part.profiles}


def normal_profile(name: str) -> str | None:
    """A MIG profile name in its canonical spelling ("MIG 1g.10gb" -> "1g.10gb"); None when
    it is not a MIG profile name at all."""
    m = _PROFILE.match(name.strip())
    if not m:
        return None
    return f"{int(m.group(1))}g.{int(m.group(2))}gb{m.group(3).lower()}"


def mig_profile(model: str, name: str) -> MigProfile | None:
    """The catalogued profile `name` of `model` (a "+me" variant has its base's slices)."""
    part = mig_parts().get(model)
    canonical = normal_profile(name)
    if part is None or canonical is None:
        return None
    base = re.sub(r"[+-]\w+$", "", canonical)
    return next((p for p in part.profiles if p.name == base), None)


def profile_from_slices(model: str | None, gpu_slices: int, memory_mib: float,
                        gpu_memory_mib: float | None) -> str:
    """The profile name of a MIG device from what NVML's device attributes give (its GPU
    instance's compute slices and its memory): the catalogued profile of `model` with those
    slices whose memory share is nearest; else "<slices>g.<GB>gb" from the memory itself,
    rounded as NVIDIA names profiles (to whole GB)."""
    part = mig_parts().get(model or "")
    if part is not None and gpu_memory_mib:
        share = memory_mib / gpu_memory_mib
        fits = [p for p in part.profiles if p.compute_slices == gpu_slices]
        if fits:
            best = min(fits, key=lambda p: abs(p.memory_slices / part.memory_slices - share))
            return best.name
    return f"{gpu_slices}g.{max(1, round(memory_mib / 1024))}gb"


def amd_partition_fraction(mode: str | None, partitions: int) -> float:
    """An AMD compute partition's share of its card (SPX or none: the whole card)."""
    return 1.0 / max(1, partitions) if mode not in (None, "SPX") else 1.0
