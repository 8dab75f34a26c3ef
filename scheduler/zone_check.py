"""Is a node's carbon zone one carbonsched can price? Zone ids are checked where they are
set (flag, environment, config file), and a zone without any carbon data is said loudly by
`config check`, the daemon and the agents, with the zones that have data and how to import
more: a one-machine install on the default zone `local` would otherwise run carbon-blind
and report its emissions as unknown forever (issue 28).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from telemetry.grid.static import static_zones

#: Electricity Maps ids (DE, US-CAL-CISO), WattTime regions (CAISO_NORTH), own site names.
ZONE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
DEFAULT_ZONE = "local"


def validate_zone(value: Any) -> str:
    """The zone id, stripped; ValueError naming the rule for anything else."""
    if not isinstance(value, str) or not ZONE_RE.match(value.strip()):
        raise ValueError(f"is not a zone id (got {value!r}): 1-64 letters, digits and . _ -, starting with a "
                         "letter or digit, e.g. DE, GB, US-CAL-CISO")
    return value.strip()


def zone_without_data(zone: str, config: Mapping[str, Any], zones_with_data: set[str] | None = None) -> str | None:
    """A warning when nothing can price `zone`: no built-in yearly mean, no `[carbon.static]`
    value, no `[carbon.zones.Z]` provider and (when the store was read) no imported data;
    None when something can. `config` is the config file's top-level table."""
    carbon = config.get("carbon") or {}
    if zone in static_zones() or zone in (carbon.get("static") or {}) or zone in (carbon.get("zones") or {}):
        return None
    if zones_with_data is not None and zone in zones_with_data:
        return None
    known = sorted(set(static_zones()) | set(zones_with_data or ()))
    what = "the default zone 'local'" if zone == DEFAULT_ZONE else f"zone {zone!r}"
    return (f"{what} has no carbon data: jobs are planned carbon-blind and their emissions stay unknown "
            f"(shown as '-'); set the node's real zone (--zone, CARBONSCHED_ZONE or `zone` in the config) to one "
            f"of {', '.join(known)}, and import hourly data with `carbonsched carbon import FILE --zone ZONE`")
