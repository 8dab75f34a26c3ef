"""The cluster as Slurm describes it (`sinfo --json`): nodes of the carbon-aware
partitions, their carbon zone (a node feature such as `zone_DE`), their GPUs by GRES type
in Slurm's index order, and whether Slurm will run jobs there (drained, down)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from scheduler.slurm.commands import SlurmCommands, SlurmError
from scheduler.slurm.config import SlurmConfig

log = logging.getLogger(__name__)

# Node states (or flags) in which Slurm starts no new jobs on the node.
UNAVAILABLE = ("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING",
               "POWERED_DOWN", "POWER_DOWN", "FUTURE", "UNKNOWN", "REBOOT_REQUESTED", "INVALID_REG")


@dataclass(frozen=True)
class SlurmGpu:
    index: int       # Slurm's GRES index on the node (what IDX and SLURM_JOB_GPUS count)
    gres_type: str   # e.g. "h100"
    model: str       # catalog model, e.g. "H100"


@dataclass(frozen=True)
class SlurmNodeInfo:
    name: str
    zone: str | None
    gpus: tuple[SlurmGpu, ...]
    state: str
    reason: str

    @property
    def unavailable(self) -> str | None:
        """Why Slurm runs nothing new here (e.g. 'DRAIN: bad fan'), or None."""
        bad = [w for w in self.state.upper().split("+") if w in UNAVAILABLE]
        if not bad:
            return None
        return f"{self.state.upper()}" + (f": {self.reason}" if self.reason else "")

    def fleet_spec(self) -> str:
        """The node's GPUs as an --emulate spec in index order, e.g. '2xH100,2xMI300X'."""
        parts: list[list] = []
        for g in self.gpus:
            if parts and parts[-1][1] == g.model:
                parts[-1][0] += 1
            else:
                parts.append([1, g.model])
        return ",".join(f"{n}x{m}" for n, m in parts)


def parse_gres(gres: str) -> list[tuple[str, int]]:
    """'gpu:h100:2,gpu:mi300x:2(S:0)' -> [('h100', 2), ('mi300x', 2)]; untyped GPUs are ''."""
    out: list[tuple[str, int]] = []
    for item in re.split(r",(?![^(]*\))", gres or ""):
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = item.split(":")
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) == 3:
            out.append((parts[1], int(parts[2])))
        elif len(parts) == 2:
            out.append(("", int(parts[1])) if parts[1].isdigit() else (parts[1], 1))
    return out


def zone_of(features: str, prefix: str) -> str | None:
    for f in re.split(r"[,&|]", features or ""):
        f = f.strip()
        if f.startswith(prefix) and len(f) > len(prefix):
            return f[len(prefix):]
    return None


def read_nodes(slurm: SlurmCommands, config: SlurmConfig) -> list[SlurmNodeInfo]:
    """The nodes of the configured partitions, each once. A GRES type the catalog does not
    know raises SlurmError naming the `gpu_models` entry to add."""
    data = slurm.json(["sinfo", "--json"])
    seen: dict[str, SlurmNodeInfo] = {}
    for raw in data.get("nodes", []):
        name = raw.get("name")
        parts = set(raw.get("partitions") or [])
        if not name or name in seen or not parts & set(config.partitions):
            continue
        gpus: list[SlurmGpu] = []
        for gres_type, count in parse_gres(raw.get("gres", "")):
            try:
                model = config.model_of(gres_type)
            except ValueError:
                raise SlurmError(f"node {name}: GRES type {gres_type!r} is not a catalog GPU model; "
                                 f"map it in [slurm] gpu_models (e.g. {gres_type or 'TYPE'} = \"H100\")") from None
            for _ in range(count):
                gpus.append(SlurmGpu(len(gpus), gres_type, model))
        state = str(raw.get("state") or "")
        flags = raw.get("state_flags") or []
        if flags:
            state = "+".join([state, *flags])
        seen[name] = SlurmNodeInfo(name=name, zone=zone_of(raw.get("active_features") or raw.get("features") or "",
                                                            config.zone_feature_prefix),
                                   gpus=tuple(gpus), state=state, reason=str(raw.get("reason") or ""))
    return list(seen.values())


def read_node(slurm: SlurmCommands, config: SlurmConfig, name: str) -> SlurmNodeInfo:
    """One node of the configured partitions; SlurmError when Slurm does not have it there."""
    for node in read_nodes(slurm, config):
        if node.name == name:
            return node
    raise SlurmError(f"Slurm has no node {name!r} in partition(s) {', '.join(config.partitions)}")
