"""The simulated cluster: nodes with a zone, GPUs and PUE, read from a TOML file.

Format (DESIGN.md, plus optional site-wide settings):

    [site]                              # all optional
    pue = 1.2                           # default PUE of nodes without their own
    amortization_years = 4              # GPU list prices are spread over this life for cost
    energy_price_usd_per_kwh = 0.15     # facility energy price (default 0: no energy cost)
    power_cap_w = 50000                 # GPU power cap of each zone's site (a PowerCap)

    [zone.DE]                           # optional per-zone overrides
    energy_price_usd_per_kwh = 0.30
    power_cap_w = 20000
    pue = 1.15                          # default PUE of the zone's nodes without their own
    static_power_w = 3000               # the site's draw besides its GPUs, against every cap
    ramp_w_per_min = 5000               # at most this much new GPU load a minute (policies.pricing.ramp)
    power_schedule = "de-events.csv"    # dated events (start,end,cap_w), relative to this file
    [[zone.DE.power_windows]]           # a daily window (UTC) with its own cap, as in the
    start = "17:00"                     # daemon's [[zones.Z.power_windows]]
    end = "19:00"
    cap_w = 12000
    [[zone.DE.power_events]]            # a dated event, as in [[zones.Z.power_events]]
    start = "2022-10-20T16:00:00Z"
    end = "2022-10-20T18:00:00Z"
    cap_w = 8000

    [sites.fra-dc2]                     # optional: a data centre with a feed of its own: the
    power_cap_w = 12000                 # same keys as a [zone.Z] budget; its nodes (site = ...)
                                        # draw against it, not against their zone's

    [[node]]
    name = "de-mi300x-1"                # unique
    zone = "DE"                         # carbon zone id (must match a --carbon ZONE=FILE)
    gpus = "8xMI300X"                   # count x catalog model ("4xH100,4xA100" mixes)
    pue = 1.2                           # optional, default [zone.Z] pue, [site] pue or 1.0
    count = 4                           # optional: that many identical nodes, named NAME-1..NAME-4
    site = "fra-dc2"                    # optional: the [sites.S] whose budget it is under

PUE is a property of the node's site (data centre), not of its grid zone: nodes of one zone
may have different PUEs (two data centres in Germany), and each GPU carries its node's.
"""

from __future__ import annotations

import logging
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from policies.model.catalog import lookup, parse_fleet
from policies.types import GpuSlot, PowerCap, site_budget
from scheduler.power_budget import ZoneBudget, parse_zone_budget
from scheduler.site import default_pue

log = logging.getLogger(__name__)

DEFAULT_AMORTIZATION_YEARS = 4.0


class ClusterSpecError(ValueError):
    """A cluster file that cannot be used, with the file and what is wrong."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    zone: str
    models: tuple[str, ...]  # one catalog model name per GPU, in index order
    pue: float
    budget: str | None = None  # its site's power budget (`site:NAME`); None: its zone's


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes and site settings; `gpu_slots()` gives the GPUs as a policy sees them."""

    nodes: tuple[NodeSpec, ...]
    amortization_years: float = DEFAULT_AMORTIZATION_YEARS
    energy_price_usd_per_kwh: dict[str, float] = field(default_factory=dict)
    power_caps: tuple[PowerCap, ...] = ()
    path: str = ""
    zone_pue: dict[str, float] = field(default_factory=dict)  # [zone.Z] pue, else [site] pue
    # zones with daily power windows: their whole budget (the constant cap included)
    budgets: dict[str, ZoneBudget] = field(default_factory=dict)

    @property
    def zones(self) -> list[str]:
        return sorted({n.zone for n in self.nodes})

    @property
    def pue(self) -> dict[str, float]:
        """Each zone's PUE where all its nodes share one, else the zone's default (each GPU
        carries its own node's PUE: `gpu_slots()`)."""
        out: dict[str, float] = {}
        for z in self.zones:
            values = {n.pue for n in self.nodes if n.zone == z}
            out[z] = values.pop() if len(values) == 1 else self.zone_pue.get(z, 1.0)
        return out

    def gpu_slots(self) -> tuple[GpuSlot, ...]:
        """All GPUs, ids 0..N-1 in node order, free and healthy."""
        slots: list[GpuSlot] = []
        for node in self.nodes:
            for index, model in enumerate(node.models):
                spec = lookup(model)
                slots.append(GpuSlot(id=len(slots), node=node.name, zone=node.zone, index=index,
                                     model=spec.name, memory_gib=spec.memory_gib, pue=node.pue,
                                     budget=node.budget))
        return tuple(slots)

    def site_zones(self) -> dict[str, str]:
        """Each site budget's key (`site:NAME`) and the grid zone its nodes are in."""
        return {n.budget: n.zone for n in self.nodes if n.budget is not None}

    def gpus_by_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            for m in node.models:
                counts[m] = counts.get(m, 0) + 1
        return counts

    def max_gpus_per_node(self) -> int:
        """The widest job one node can take (jobs never span nodes or GPU models)."""
        best = 0
        for node in self.nodes:
            for m in set(node.models):
                best = max(best, node.models.count(m))
        return best

    def describe(self) -> str:
        parts = [f"{m}x{n}" for m, n in sorted(self.gpus_by_model().items())]
        return (f"{len(self.nodes)} nodes, {sum(self.gpus_by_model().values())} GPUs "
                f"({', '.join(parts)}) in {', '.join(self.zones)}")


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster TOML file; ClusterSpecError says what is wrong and where."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ClusterSpecError(f"cluster file {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ClusterSpecError(f"cluster file {path} is not valid TOML: {e}") from None
    return cluster_from_dict(data, str(path))


def cluster_from_dict(data: dict, path: str = "<cluster>") -> ClusterSpec:
    """Build a ClusterSpec from parsed TOML (see the module docstring for the format)."""
    def fail(msg: str) -> ClusterSpecError:
        return ClusterSpecError(f"cluster file {path}: {msg}")

    unknown = set(data) - {"site", "zone", "node", "sites"}
    if unknown:
        raise fail(f"unknown table(s) {', '.join(sorted(unknown))}; expected [site], [zone.X], [sites.S], [[node]]")
    site_tables = data.get("sites", {})
    if not isinstance(site_tables, dict) or not all(isinstance(t, dict) for t in site_tables.values()):
        raise fail("[sites.S] entries must be tables")
    site = data.get("site", {})
    zone_tables = data.get("zone", {})
    nodes_raw = data.get("node", [])
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise fail("no [[node]] entries")
    site_pue = _positive(site.get("pue", 1.0), "site pue", fail)
    if site_pue < 1.0:
        raise fail(f"site pue {site_pue} is below 1.0")
    zone_pue = _zone_pues(zone_tables, fail)
    nodes = _node_specs(nodes_raw, zone_pue, site_pue, site_tables, fail)
    by_zone = {n.zone for n in nodes}
    for zone in zone_tables:
        if zone not in by_zone:
            raise fail(f"[zone.{zone}] names a zone without nodes")
    base_dir = Path(path).parent if path != "<cluster>" else None
    prices, caps, budgets = _zone_budgets(sorted(by_zone), zone_tables, site, base_dir, fail)
    site_caps, site_budgets = _site_budgets(site_tables, nodes, base_dir, fail)
    years = _positive(site.get("amortization_years", DEFAULT_AMORTIZATION_YEARS), "amortization_years", fail)
    return ClusterSpec(nodes=tuple(nodes), amortization_years=years, energy_price_usd_per_kwh=prices,
                       power_caps=tuple(caps + site_caps), path=path, budgets={**budgets, **site_budgets},
                       zone_pue={z: default_pue(z, zone_pue, site_pue) for z in sorted(by_zone)})


def _zone_pues(zone_tables, fail) -> dict[str, float]:
    """The [zone.Z] pue of each zone that sets one."""
    if not isinstance(zone_tables, dict) or not all(isinstance(t, dict) for t in zone_tables.values()):
        raise fail("[zone.X] entries must be tables")
    zone_pue: dict[str, float] = {}
    for zone, zt in zone_tables.items():
        if "pue" in zt:
            zone_pue[zone] = _positive(zt["pue"], f"zone {zone} pue", fail)
            if zone_pue[zone] < 1.0:
                raise fail(f"zone {zone} pue {zone_pue[zone]} is below 1.0")
    return zone_pue


def _node_specs(nodes_raw: list, zone_pue: dict[str, float], site_pue: float, site_tables: dict,
                fail) -> list[NodeSpec]:
    """The [[node]] entries as NodeSpecs, a `count = N` entry as N nodes NAME-1..NAME-N."""
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(nodes_raw, 1):
        where = f"node #{i}"
        if not isinstance(raw, dict):
            raise fail(f"{where} is not a table")
        extra = set(raw) - {"name", "zone", "gpus", "pue", "count", "site"}
        if extra:
            raise fail(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        for key in ("name", "zone", "gpus"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise fail(f"{where}: '{key}' must be a non-empty string")
        try:
            models = tuple(m.name for m in parse_fleet(raw["gpus"]))
        except ValueError as e:
            raise fail(f"{where} ({raw['name']}): {e}") from None
        pue = _positive(raw["pue"] if "pue" in raw else default_pue(raw["zone"].strip(), zone_pue, site_pue),
                        f"{where} pue", fail)
        if pue < 1.0:
            raise fail(f"{where}: pue {pue} is below 1.0")
        budget = None
        if "site" in raw:
            if not isinstance(raw["site"], str) or raw["site"].strip() not in site_tables:
                raise fail(f"{where}: site {raw['site']!r} has no [sites.S] table")
            budget = site_budget(raw["site"].strip())
        count = raw.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise fail(f"{where}: count must be a positive integer")
        names = [raw["name"]] if count == 1 else [f"{raw['name']}-{k}" for k in range(1, count + 1)]
        for name in names:
            if name in seen:
                raise fail(f"duplicate node name {name!r}")
            seen.add(name)
            nodes.append(NodeSpec(name=name, zone=raw["zone"].strip(), models=models, pue=float(pue),
                                  budget=budget))
    return nodes


def _zone_budgets(zones: list[str], zone_tables: dict, site: dict, base_dir: Path | None,
                  fail) -> tuple[dict[str, float], list[PowerCap], dict[str, ZoneBudget]]:
    """Each zone's energy price, constant GPU power cap and (with windows, events, static
    power or a ramp limit) its whole budget, as the daemon reads them."""
    prices: dict[str, float] = {}
    caps: list[PowerCap] = []
    budgets: dict[str, ZoneBudget] = {}
    for zone in zones:
        zt = zone_tables.get(zone, {})
        price = zt.get("energy_price_usd_per_kwh", site.get("energy_price_usd_per_kwh", 0.0))
        prices[zone] = _non_negative(price, f"zone {zone} energy_price_usd_per_kwh", fail)
        cap = zt.get("power_cap_w", site.get("power_cap_w"))
        if cap is not None:
            cap = _positive(cap, f"zone {zone} power_cap_w", fail)
        timed = {k: zt[k] for k in ("power_windows", "power_events", "power_schedule", "static_power_w",
                                    "ramp_w_per_min") if k in zt}
        budget = None
        if timed:  # windows, dated events, static power: the daemon's budget (scheduler.power_budget)
            try:
                budget = parse_zone_budget(zone, {**timed, **({"power_cap_w": cap} if cap is not None else {})},
                                           base_dir=base_dir)
            except ValueError as e:
                raise fail(str(e).removeprefix("config ")) from None
        if cap is not None:  # the constant cap of GPU power: the site's less its static power
            caps.append(PowerCap(zone=zone, cap_w=cap - (budget.static_w if budget is not None else 0.0)))
        if budget is not None and (budget.windows or budget.events or budget.static_w or budget.ramp_w_per_min):
            budgets[zone] = budget
    return prices, caps, budgets


def _site_budgets(site_tables: dict, nodes: list[NodeSpec], base_dir: Path | None,
                  fail) -> tuple[list[PowerCap], dict[str, ZoneBudget]]:
    """The [sites.S] budgets, by key `site:NAME`: each site in one zone, with nodes and a budget."""
    caps: list[PowerCap] = []
    budgets: dict[str, ZoneBudget] = {}
    used_sites = {n.budget for n in nodes if n.budget is not None}
    for key in sorted(used_sites):
        zones_of_site = sorted({n.zone for n in nodes if n.budget == key})
        if len(zones_of_site) > 1:
            raise fail(f"[sites.{key.removeprefix('site:')}]: its nodes are in zones {', '.join(zones_of_site)}; "
                       "a site is in one grid zone")
    for name, st in sorted(site_tables.items()):
        key = site_budget(name)
        if key not in used_sites:
            raise fail(f"[sites.{name}] has no nodes (give its nodes site = {name!r})")
        unknown_keys = set(st) - {"power_cap_w", "power_windows", "power_events", "power_schedule",
                                  "static_power_w", "ramp_w_per_min"}
        if unknown_keys:
            raise fail(f"[sites.{name}]: unknown key(s) {', '.join(sorted(unknown_keys))}")
        try:
            budget = parse_zone_budget(name, st, base_dir=base_dir, where=f"sites.{name}")
        except ValueError as e:
            raise fail(str(e).removeprefix("config ")) from None
        if budget is None:
            raise fail(f"[sites.{name}]: a site needs a power budget (power_cap_w, power_windows, ...)")
        if budget.cap_w is not None:
            caps.append(PowerCap(zone=key, cap_w=budget.cap_w - budget.static_w))
        if budget.windows or budget.events or budget.static_w or budget.ramp_w_per_min:
            budgets[key] = budget
    return caps, budgets


def _positive(value, what: str, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise fail(f"{what} must be a positive number (got {value!r})")
    return float(value)


def _non_negative(value, what: str, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise fail(f"{what} must be a number >= 0 (got {value!r})")
    return float(value)
