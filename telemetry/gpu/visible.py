"""Honour a visible-devices restriction (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, ...) set
in the agent's own environment, e.g. by a systemd unit that gives one agent half a node.

The variables are read the way the vendor runtimes read them: a comma-separated list of
indices or UUIDs (a unique prefix is enough); an empty value hides every GPU; the list stops
at the first entry that names no GPU, as CUDA's does. The restriction only chooses which GPUs
this agent manages: the devices keep their physical index, because jobs are started with a
fresh environment in which carbonsched sets the visible-devices variables itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_INDEX = re.compile(r"^\d+$")


def parse_visible(value: str | None) -> list[str] | None:
    """The entries of a visible-devices variable; None when it is unset (no restriction)."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    return [] if entries == [""] else entries


def select_visible(devices: Sequence[T], value: str | None, *, var: str,
                   ids_of: Callable[[T], Sequence[str]]) -> list[T]:
    """The devices a visible-devices variable selects, in the variable's order.

    `devices` are in the order the variable's indices count; `ids_of(d)` gives the UUID
    spellings a device may be named by.
    """
    entries = parse_visible(value)
    if entries is None:
        return list(devices)
    chosen: list[T] = []
    for entry in entries:
        match: T | None = None
        if _INDEX.match(entry):
            i = int(entry)
            match = devices[i] if i < len(devices) else None
        elif entry:
            hits = [d for d in devices
                    if any(u.lower().startswith(entry.lower()) for u in ids_of(d) if u)]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in chosen:
            log.warning("%s=%s: entry %r names no (other) GPU; like the runtime, this agent "
                        "ignores it and every entry after it", var, value, entry)
            break
        chosen.append(match)
    if not chosen:
        log.warning("%s=%r in the agent's environment hides every GPU from this agent", var, value)
    return chosen
