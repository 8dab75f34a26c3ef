"""The emulated fleet spec of `--emulate`: "COUNTxMODEL" parts joined by commas, each with
optional partition layouts after colons, checked against the catalogs:

    2xH100                          two whole H100s
    1xH100:mig=1g.10gb*7            one H100 in MIG mode with seven 1g.10gb instances
    1xH100:mig=3g.40gb+2g.20gb+1g.10gb*2
                                    one H100 split 3 + 2 + 1 + 1 compute slices
    2xMI300X:partition=QPX:nps=NPS4 two MI300X cards, four compute partitions each, NPS4

A MIG layout must fit the part (policies/data/partitions.toml: the profile exists on it, at
most its `max` instances of a profile, at most the GPU's compute and memory slices in all);
an AMD partition mode must be one the part has. Time-sliced sharing is not a layout of the
hardware: the operator declares it with `gpu_shares` (scheduler.node.config), on emulated
and real nodes alike.
"""

from __future__ import annotations

import re

from policies.model.catalog import GpuModel, parse_fleet
from policies.model.partitions import amd_parts, mig_parts, normal_profile
from telemetry.gpu import EmulatedModel

_PROFILE_COUNT = re.compile(r"^(.+?)(?:\*(\d+))?$")


def parse_emulated_fleet(spec: str) -> list[EmulatedModel]:
    """The emulated GPUs of `spec`, one EmulatedModel per GPU or AMD partition, in order.
    ValueError naming the offending part on any mistake."""
    out: list[EmulatedModel] = []
    for part in (spec or "").split(","):
        base, *options = part.split(":")
        models = parse_fleet(base)
        layout = _options(part.strip(), models[0], options)
        for m in models:
            out.extend(_expand(m, **layout))
    if not out:
        parse_fleet(spec)  # raises its own message for an empty spec
    return out


def _options(part: str, model: GpuModel, options: list[str]) -> dict:
    layout: dict = {"mig": (), "partition": None, "nps": None}
    for option in options:
        key, _, value = option.strip().partition("=")
        key, value = key.strip().lower(), value.strip()
        if key == "mig" and value:
            layout["mig"] = _mig_layout(part, model, value)
        elif key == "partition" and value:
            layout["partition"] = _amd_mode(part, model, value.upper())
        elif key == "nps" and value:
            layout["nps"] = _nps(part, model, value.upper())
        else:
            raise ValueError(f"bad option {option.strip()!r} in {part!r}; expected mig=PROFILE[*N][+...], "
                             "partition=SPX|DPX|QPX|CPX or nps=NPS1|NPS4")
    if layout["nps"] and not layout["partition"]:
        layout["partition"] = "SPX"
    return layout


def _mig_layout(part: str, model: GpuModel, value: str) -> tuple[tuple[int, float], ...]:
    table = mig_parts().get(model.name)
    if table is None:
        raise ValueError(f"{part!r}: {model.name} has no MIG profiles in the catalog "
                         f"(MIG parts: {', '.join(sorted(mig_parts()))})")
    by_name = {p.name: p for p in table.profiles}
    devices: list[tuple[int, float]] = []
    used_compute = used_memory = 0
    for item in value.split("+"):
        m = _PROFILE_COUNT.match(item.strip())
        name = normal_profile(m.group(1)) if m else None
        profile = by_name.get(name or "")
        if profile is None:
            raise ValueError(f"{part!r}: {item.strip()!r} is not a MIG profile of {model.name} "
                             f"({', '.join(by_name)})")
        count = int(m.group(2) or 1)
        if not 1 <= count <= profile.max_instances:
            raise ValueError(f"{part!r}: {model.name} holds 1 to {profile.max_instances} "
                             f"{profile.name} instances, not {count}")
        used_compute += count * profile.compute_slices
        used_memory += count * profile.memory_slices
        memory_mib = model.memory_gib * 1024 * profile.memory_slices / table.memory_slices
        devices += [(profile.compute_slices, round(memory_mib, 1))] * count
    if used_compute > table.compute_slices or used_memory > table.memory_slices:
        raise ValueError(f"{part!r}: the instances take {used_compute} of {table.compute_slices} "
                         f"compute slices and {used_memory} of {table.memory_slices} memory slices: "
                         "more than one GPU has")
    return tuple(devices)


def _amd_mode(part: str, model: GpuModel, mode: str) -> str:
    table = amd_parts().get(model.name)
    if table is None or mode not in table.compute_modes:
        have = ", ".join(table.compute_modes) if table else "none in the catalog"
        raise ValueError(f"{part!r}: {model.name} has no compute partition mode {mode} ({have})")
    return mode


def _nps(part: str, model: GpuModel, mode: str) -> str:
    table = amd_parts().get(model.name)
    if table is None or mode not in table.memory_modes:
        have = ", ".join(table.memory_modes) if table else "none in the catalog"
        raise ValueError(f"{part!r}: {model.name} has no memory partition mode {mode} ({have})")
    return mode


def _expand(m: GpuModel, *, mig: tuple, partition: str | None, nps: str | None) -> list[EmulatedModel]:
    if partition is None:
        return [EmulatedModel(model=m.name, vendor=m.vendor, memory_gib=m.memory_gib, idle_w=m.idle_w,
                              tdp_w=m.tdp_w, mig=mig)]
    n = amd_parts()[m.name].compute_modes[partition]
    return [EmulatedModel(model=m.name, vendor=m.vendor, memory_gib=round(m.memory_gib / n, 2),
                          idle_w=m.idle_w / n, tdp_w=m.tdp_w / n,
                          partition_mode=partition if n > 1 else None, partitions=n,
                          memory_partition=nps)
            for _ in range(n)]
