"""The `[carbon]` configuration: which zones have a live provider, credentials, budgets.

`CarbonConfig.from_config` reads the config file's `carbon` table and the environment (the
environment wins); the providers it accepts are those of `scheduler.carbon_providers`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.carbon_providers import DEFAULT_MIN_INTERVAL_S, PROVIDERS
from telemetry.grid.readings import SIGNALS


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    from scheduler.timeparse import parse_duration

    try:
        return parse_duration(str(value))
    except ValueError as e:
        raise ValueError(f"carbon config {name}: {e}") from None


@dataclass
class ZoneConfig:
    """How one zone gets its signal: which live provider (if any) and which signal."""

    zone: str
    provider: str | None = None
    region: str | None = None          # the provider's own id for the zone (default: zone)
    signal: str | None = None          # average | marginal; None: whatever the data has
    horizon_hours: int = 72


@dataclass
class CarbonConfig:
    """The `[carbon]` section of the config file, with credentials from the environment.

    ```toml
    [carbon]
    electricitymaps_token_file = "/etc/carbonsched/credentials/electricitymaps_token"  # root-only
    watttime_username = "..."          # or CARBONSCHED_WATTTIME_USERNAME
    watttime_password_file = "/etc/carbonsched/credentials/watttime_password"          # root-only
    timeout = "10s"
    forecast_max_age = "6h"
    own_forecast = "model"             # or "baseline" (profile + anomaly only)
    model_fit = "background"           # or "inline" (fit in the querying thread)
    [carbon.zones.DE]
    provider = "electricitymaps"
    [carbon.zones.CAISO_NORTH]
    provider = "watttime"
    [carbon.zones.GB]
    provider = "ukgrid"
    [carbon.static]                    # own yearly averages, gCO2eq/kWh
    FR = 56
    ```
    Each secret comes from CARBONSCHED_<KEY>, else the key itself (only in a root-only config),
    else `<key>_file`, else the systemd credential of that name (scheduler.credentials).
    Secrets never appear in repr() or logs.
    """

    zones: dict[str, ZoneConfig] = field(default_factory=dict)
    electricitymaps_token: str | None = field(default=None, repr=False)
    watttime_username: str | None = None
    watttime_password: str | None = field(default=None, repr=False)
    electricitymaps_url: str | None = None
    watttime_url: str | None = None
    ukgrid_url: str | None = None
    emission_factor: str = "direct"
    timeout_s: float = 10.0
    retries: int = 2
    forecast_max_age_s: float = 6 * 3600.0
    #: the own forecast: "model" (learned, telemetry.grid.forecast_model; the baseline serves
    #: beyond its 72 h and until it is fitted) or "baseline" (profile + anomaly only)
    own_forecast: str = "model"
    #: fit the learned model in the querying thread (True) or in the background (False)
    model_fit_inline: bool = False
    min_interval_s: dict[tuple[str, str], float] = field(default_factory=lambda: dict(DEFAULT_MIN_INTERVAL_S))
    static: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None,
                    env: Mapping[str, str] | None = None) -> CarbonConfig:
        """Build from the parsed config file (its `carbon` table) and the environment.

        The environment wins over the file, as for every other setting. ValueError on a bad
        value.
        """
        env = os.environ if env is None else env
        section = dict((config or {}).get("carbon", {}) or {})
        cfg = cls()
        cfg.electricitymaps_token = _secret(section, env, "electricitymaps_token")
        cfg.watttime_username = env.get("CARBONSCHED_WATTTIME_USERNAME") or section.get("watttime_username")
        cfg.watttime_password = _secret(section, env, "watttime_password")
        cfg.electricitymaps_url = section.get("electricitymaps_url")
        cfg.watttime_url = section.get("watttime_url")
        cfg.ukgrid_url = section.get("ukgrid_url")
        cfg.emission_factor = str(section.get("emission_factor", "direct"))
        if cfg.emission_factor not in ("direct", "lifecycle"):
            raise ValueError("carbon config emission_factor: use direct or lifecycle")
        if "timeout" in section:
            cfg.timeout_s = _seconds(section["timeout"], "timeout")
        if "retries" in section:
            cfg.retries = int(section["retries"])
        if "forecast_max_age" in section:
            cfg.forecast_max_age_s = _seconds(section["forecast_max_age"], "forecast_max_age")
        if "own_forecast" in section:
            cfg.own_forecast = str(section["own_forecast"])
            if cfg.own_forecast not in ("model", "baseline"):
                raise ValueError(f"carbon config own_forecast: {cfg.own_forecast!r}; use model or baseline")
        if "model_fit" in section:
            fit = str(section["model_fit"])
            if fit not in ("background", "inline"):
                raise ValueError(f"carbon config model_fit: {fit!r}; use background or inline")
            cfg.model_fit_inline = fit == "inline"
        for key, value in (section.get("min_interval") or {}).items():
            provider, _, endpoint = str(key).partition(".")
            cfg.min_interval_s[(provider, endpoint)] = _seconds(value, f"min_interval.{key}")
        for zone, value in (section.get("static") or {}).items():
            v = float(value)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"carbon config static.{zone}: {value!r} is not a valid intensity")
            cfg.static[str(zone)] = v
        for zone, zc in (section.get("zones") or {}).items():
            if not isinstance(zc, Mapping):
                raise ValueError(f"carbon config zones.{zone}: expected a table")
            provider = zc.get("provider")
            if provider in ("", "none"):
                provider = None
            if provider is not None and provider not in PROVIDERS:
                raise ValueError(f"carbon config zones.{zone}.provider: {provider!r}; "
                                 f"use one of {', '.join(PROVIDERS)} or none")
            signal = zc.get("signal")
            if signal is not None and signal not in SIGNALS:
                raise ValueError(f"carbon config zones.{zone}.signal: use average or marginal")
            cfg.zones[str(zone)] = ZoneConfig(zone=str(zone), provider=provider, region=zc.get("region"),
                                              signal=signal, horizon_hours=int(zc.get("horizon_hours", 72)))
        return cfg


def _secret(section: Mapping[str, Any], env: Mapping[str, str], key: str) -> str | None:
    """A provider's secret: CARBONSCHED_<KEY>, else `key` in [carbon] (only in a root-only
    config: `config check` refuses it in one others can read), else the root-only file named
    by `<key>_file`, else the systemd credential `key` (issue 48)."""
    from scheduler.credentials import read_credential, read_secret

    if env.get("CARBONSCHED_" + key.upper()):
        return env["CARBONSCHED_" + key.upper()]
    inline, file = section.get(key), section.get(key + "_file")
    if inline is not None and file is not None:
        raise ValueError(f"carbon config {key} and {key}_file are both set: keep one ({key}_file)")
    if inline is not None:
        return str(inline)
    if file is not None:
        try:
            return read_secret(str(file))
        except ValueError as e:
            raise ValueError(f"carbon config {key}_file: {e}") from None
    return read_credential(key, env)
