"""The site's configuration as the planner, the governor and accounting read it: PUE per
node's data centre and power budgets per zone or site, parsed from the config file's
`[site]`, `[zones.Z]`, `[sites.S]` and `[nodes.N]` tables.

A core type: the daemon's planner and power governor, accounting and the command line
(`carbonsched report`, the config check) all take a `SiteConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from policies.types import SITE_BUDGET_PREFIX, PowerCap, site_budget
from scheduler.power_budget import ZoneBudget, caps_between, parse_zone_budget


@dataclass(frozen=True)
class SiteConfig:
    """PUE per node's site (with zone and global defaults) and GPU power caps per zone.

    PUE belongs to a data centre, not to a grid zone: one zone can hold several sites with
    different PUEs. A node's PUE is, first found: its own `[nodes.NAME] pue`, the PUE of
    the `[sites.S]` listing it, its zone's `[zones.Z] pue`, `[site] pue`, 1.0.

    ```toml
    [site]
    pue = 1.3                # every node without a more specific value (default 1.0)
    [zones.DE]
    pue = 1.15               # default of the zone's nodes
    power_cap_w = 40000      # at most this much GPU power at once in the zone
    [sites.fra-dc2]          # a data centre: its PUE and its nodes
    pue = 1.08
    nodes = ["de-gpu-1", "de-gpu-2"]
    power_cap_w = 30000      # optional: the site's own feed (also power_windows, power_events,
                             # power_schedule, static_power_w, ramp_w_per_min, as for a zone)
    [nodes.de-gpu-9]
    pue = 1.4                # one node's own value
    ```
    (Inside `[carbonsched]` when the file uses that table.) ValueError on a bad value.
    """

    site_pue: float = 1.0
    zone_pue: Mapping[str, float] = field(default_factory=dict)
    # power budgets by key (`policies.types.budget_of`): a zone's (`DE`: its nodes outside any
    # budgeted site) or a site's (`site:fra-dc2`: the nodes it lists), with their windows
    budgets: Mapping[str, ZoneBudget] = field(default_factory=dict)
    node_pue: Mapping[str, float] = field(default_factory=dict)  # [nodes.NAME] pue
    sites_pue: Mapping[str, float] = field(default_factory=dict)  # [sites.S] pue
    site_of: Mapping[str, str] = field(default_factory=dict)  # node -> its [sites.S]
    # What operators allow of GPU power limits: `[power]` (policies.pricing.power_cap.CapBounds).
    caps: Any = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> SiteConfig:
        config = config or {}
        site = config.get("site") or {}
        zones = config.get("zones") or {}
        if not isinstance(site, Mapping):
            raise ValueError("config [site]: expected a table")
        if not isinstance(zones, Mapping):
            raise ValueError("config [zones]: expected a table of zones, e.g. [zones.DE]")
        site_pue = _pue(site.get("pue", 1.0), "site.pue")
        unknown = sorted(set(site) - {"pue"})
        if unknown:
            raise ValueError(f"config [site]: unknown key(s) {', '.join(unknown)} (known: pue)")
        pue: dict[str, float] = {}
        budgets: dict[str, ZoneBudget] = {}
        for zone, zc in zones.items():
            if not isinstance(zc, Mapping):
                raise ValueError(f"config zones.{zone}: expected a table with pue and/or power_cap_w")
            known = ("pue", "power_cap_w", "power_windows", "power_events", "power_schedule", "static_power_w",
                     "ramp_w_per_min")
            unknown = sorted(set(zc) - set(known))
            if unknown:
                raise ValueError(f"config zones.{zone}: unknown key(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(known)})")
            if "pue" in zc:
                pue[str(zone)] = _pue(zc["pue"], f"zones.{zone}.pue")
            budget = parse_zone_budget(str(zone), zc)
            if budget is not None:
                budgets[str(zone)] = budget
        sites_pue, site_of, site_budgets = _sites(config.get("sites") or {})
        node_pue = _nodes(config.get("nodes") or {})
        from policies.pricing.power_cap import CapBounds

        return cls(site_pue=site_pue, zone_pue=pue, budgets={**budgets, **site_budgets}, node_pue=node_pue,
                   sites_pue=sites_pue, site_of=site_of, caps=CapBounds.from_config(config))

    def budget_of_node(self, node: str | None) -> str | None:
        """The budget key of `node`'s site when that site has a power budget (`site:NAME`);
        None: the node draws against its zone's budget, if any."""
        site = self.site_of.get(node) if node is not None else None
        key = site_budget(site) if site is not None else None
        return key if key in self.budgets else None

    def budget_nodes(self, key: str) -> tuple[str, ...] | None:
        """The nodes of a site's budget (`site:NAME`); None for a zone's budget (it covers
        its zone's nodes that are in no budgeted site)."""
        if not key.startswith(SITE_BUDGET_PREFIX):
            return None
        site = key[len(SITE_BUDGET_PREFIX):]
        return tuple(sorted(n for n, s in self.site_of.items() if s == site))

    def site_budget_nodes(self) -> dict[str, tuple[str, ...]]:
        """Each site budget's key and its nodes (what the governor measures it over)."""
        return {k: members for k in self.budgets if (members := self.budget_nodes(k)) is not None}

    def pue(self, zone: str | None, node: str | None = None) -> float:
        """The PUE of `node` (in `zone`): its own, its site's, its zone's, else the default."""
        own = self.node_site_pue(node)
        if own is not None:
            return own
        return default_pue(zone, self.zone_pue, self.site_pue)

    def node_site_pue(self, node: str | None) -> float | None:
        """The PUE set for `node` itself or for its site; None when only defaults apply."""
        if node is None:
            return None
        if node in self.node_pue:
            return self.node_pue[node]
        site = self.site_of.get(node)
        return self.sites_pue.get(site) if site is not None else None

    def pue_source(self, zone: str | None, node: str | None = None) -> str:
        """Where `pue(zone, node)` comes from, in the config's words (for receipts and exports)."""
        if node is not None and node in self.node_pue:
            return f"nodes.{node}"
        if node is not None and self.site_of.get(node) in self.sites_pue:
            return f"sites.{self.site_of[node]}"
        if zone is not None and zone in self.zone_pue:
            return f"zones.{zone}"
        return "site"

    def power_caps(self, budgets: Iterable[str] | None = None, now: datetime | None = None,
                   horizon_s: float = 0.0) -> tuple[PowerCap, ...]:
        """The power budgets with these keys (zones' and `site:NAME`s; all configured when
        None) as PowerCaps: the caps always in force, and with `now` each daily window that
        overlaps the next `horizon_s` (`scheduler.power_budget`)."""
        if now is None:
            wanted = None if budgets is None else set(budgets)
            return tuple(PowerCap(zone=z, cap_w=b.cap_w) for z, b in sorted(self.budgets.items())
                         if b.cap_w is not None and (wanted is None or z in wanted))
        return caps_between(self.budgets, budgets, now, now + timedelta(seconds=horizon_s))


SITE_BUDGET_KEYS = ("power_cap_w", "power_windows", "power_events", "power_schedule", "static_power_w",
                    "ramp_w_per_min")


def default_pue(zone: str | None, zone_pue: Mapping[str, float], site_pue: float) -> float:
    """The PUE of a node that sets none of its own (nor has a site that does): its zone's
    (`[zones.Z] pue`), else the site-wide default (`[site] pue`). The one rule of the
    daemon's `SiteConfig` and of the simulator's cluster file (`scheduler.simulate.cluster`)."""
    return zone_pue.get(zone, site_pue) if zone is not None else site_pue


def _sites(table: object) -> tuple[dict[str, float], dict[str, str], dict[str, ZoneBudget]]:
    """`[sites.S] pue = X, nodes = [...]` and optionally a power budget of the site's own
    (`power_cap_w` and the other keys of a zone's): PUE per site, the site of each node and
    the budgets by key (`site:S`)."""
    if not isinstance(table, Mapping):
        raise ValueError("config [sites]: expected a table of sites, e.g. [sites.fra-dc2]")
    pue: dict[str, float] = {}
    site_of: dict[str, str] = {}
    budgets: dict[str, ZoneBudget] = {}
    known = ("pue", "nodes", *SITE_BUDGET_KEYS)
    for site, sc in table.items():
        if not isinstance(sc, Mapping):
            raise ValueError(f"config sites.{site}: expected a table with pue and nodes")
        unknown = sorted(set(sc) - set(known))
        if unknown:
            raise ValueError(f"config sites.{site}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
        budget = parse_zone_budget(str(site), {k: sc[k] for k in SITE_BUDGET_KEYS if k in sc}, where=f"sites.{site}")
        if budget is not None:
            budgets[site_budget(str(site))] = budget
        if "pue" not in sc and budget is None:
            raise ValueError(f"config sites.{site}.pue: missing (a site has its PUE, a power budget of its own "
                             f"(power_cap_w, ...) or both)")
        if "pue" in sc:
            pue[str(site)] = _pue(sc["pue"], f"sites.{site}.pue")
        members = sc.get("nodes", [])
        if not isinstance(members, list) or not all(isinstance(n, str) and n.strip() for n in members):
            raise ValueError(f"config sites.{site}.nodes: a list of node names (got {members!r})")
        for n in members:
            if n.strip() in site_of:
                raise ValueError(f"config sites.{site}.nodes: node {n.strip()!r} is already in site "
                                 f"{site_of[n.strip()]!r}; a node is in one site")
            site_of[n.strip()] = str(site)
        if budget is not None and not members:
            raise ValueError(f"config sites.{site}.nodes: a site with a power budget lists its nodes")
    return pue, site_of, budgets


def _nodes(table: object) -> dict[str, float]:
    """`[nodes.NAME] pue = X`: a node's own PUE."""
    if not isinstance(table, Mapping):
        raise ValueError("config [nodes]: expected a table of nodes, e.g. [nodes.gpu-7]")
    out: dict[str, float] = {}
    for node, nc in table.items():
        if not isinstance(nc, Mapping):
            raise ValueError(f"config nodes.{node}: expected a table with pue")
        unknown = sorted(set(nc) - {"pue"})
        if unknown:
            raise ValueError(f"config nodes.{node}: unknown key(s) {', '.join(unknown)} (known: pue)")
        if "pue" in nc:
            out[str(node)] = _pue(nc["pue"], f"nodes.{node}.pue")
    return out


def _pue(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"config {name}: a number >= 1.0 (got {value!r})")
    if not 1.0 <= value <= 5.0:
        raise ValueError(f"config {name}: a PUE is between 1.0 and 5.0 (got {value!r}): it is "
                         "facility power over IT power")
    return float(value)
