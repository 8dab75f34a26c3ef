"""`carbonsched carbon ...`: import traces, show a zone's value and forecast, list zones.

These verbs talk to the store directly (no daemon needed), resolving the database like the
`db` verbs: --db, CARBONSCHED_DB, the config file, else the SQLite file under the state dir.

    carbonsched carbon import FILE [--zone Z] [--format F] [--timezone TZ] [--as-forecast] [--json]
        (FILE: a carbon-intensity trace, or a day-ahead wind and solar forecast file)
    carbonsched carbon show --zone Z [--at T] [--hours N] [--as-of T] [--refresh] [--json]
    carbonsched carbon zones [--json]

Only the standard library and `scheduler.cli.common` are imported at module level (the
CLI starts fast, and scheduler.cli.main imports this module up front); everything else is
imported in `run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

from scheduler.cli.common import JSON_HELP, EXIT_OK, EXIT_USAGE, CliError, db_url, register
from scheduler.settings import env_help

FORMATS = ("electricitymaps", "watttime", "plain", "vessim")
PROGRESS_MIN_BYTES = 256 * 1024


def _db_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=env_help("database URL (default SQLite under the state dir)", "CARBONSCHED_DB"))
    p.add_argument("--state-dir", help=env_help("state directory (for the default SQLite URL)",
                                                 "CARBONSCHED_STATE_DIR"))


def add_parser(subparsers) -> None:
    """Add the `carbon` verb and its actions to the top-level subparsers.

    Also registers `run` as the handler of the `carbon` verb in scheduler.cli.common.VERBS, so
    wiring it into the CLI takes just the import and this call.
    """
    c = subparsers.add_parser("carbon", help="grid carbon intensity: import traces, show values and forecasts",
                              description="Grid carbon intensity per zone, from the store.")
    sub = c.add_subparsers(dest="carbon_action", metavar="ACTION", required=True)

    imp = sub.add_parser(
        "import", help="import a carbon-intensity trace file into the store",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Import an Electricity Maps hourly export, a WattTime MOER file (lbs/MWh, stored as\n"
                    "marginal gCO2/kWh) or a plain CSV with the columns\n"
                    "  time,gco2_per_kwh[,zone][,signal][,issued_at]\n"
                    "signal is average (default) or marginal. issued_at is when a value was forecast:\n"
                    "a row with it is a forecast, used by plans from that time on. A row without it is\n"
                    "an actual (a measured value), known only once its period has ended: rows that lie\n"
                    "in the future are then not used by any plan or `carbon show` until they are past.\n"
                    "The import says how many rows lie in the future; --as-forecast stores those as a\n"
                    "forecast issued at import time instead.\n\n"
                    "It also reads grid operators' day-ahead wind and solar generation forecasts (ENTSO-E\n"
                    "\"Generation Forecasts for Wind and Solar\"): the Transparency Platform's CSV export\n"
                    "(MTU (CET/CEST), Generation - Solar [MW] Day Ahead/ ...) and the `UTC time,solar,wind`\n"
                    "layout of hourly sums (DE, GB). They are stored as hourly mean MW, each day known from\n"
                    "18:00 local time the day before; --zone is required, and a file with gaps or\n"
                    "duplicated hours is refused.")
    imp.add_argument("file", help="the CSV file")
    imp.add_argument("--zone", help="zone id to store under (default: the file's own zone column)")
    imp.add_argument("--format", dest="fmt", choices=FORMATS, help="file format (default: from the header)")
    imp.add_argument("--timezone", default="UTC", metavar="TZ",
                     help="time zone of timestamps without an offset in plain files (default UTC)")
    imp.add_argument("--as-forecast", action="store_true",
                     help="store rows without issued_at whose period has not ended yet as a forecast "
                          "issued now (default: actuals, unused until their period is past)")
    imp.add_argument("--json", action="store_true", help=JSON_HELP)
    _db_flags(imp)

    sh = sub.add_parser("show", help="a zone's value at a time, its forecast, source and freshness")
    sh.add_argument("--zone", required=True, help="zone id, e.g. DE, GB, US-CAL-CISO")
    sh.add_argument("--at", metavar="T", help="time: ISO 8601 (local if no offset) or a duration from now; "
                                              "default now")
    sh.add_argument("--hours", type=float, default=24.0, metavar="N", help="forecast hours from --at (default 24)")
    sh.add_argument("--as-of", metavar="T", help="use only what was known at this time (default now)")
    sh.add_argument("--signal", choices=("average", "marginal"), help="signal (default: the zone's)")
    sh.add_argument("--refresh", action="store_true",
                    help="first fetch from the zone's live provider (within its call budget)")
    sh.add_argument("--json", action="store_true", help=JSON_HELP)
    _db_flags(sh)

    fg = sub.add_parser("forget", help="delete every value of a zone from the store, day-ahead wind and solar "
                                       "forecasts included (e.g. imported under a wrong zone id)")
    fg.add_argument("--zone", required=True, help="the zone id to delete")
    fg.add_argument("--json", action="store_true", help=JSON_HELP)
    _db_flags(fg)

    zs = sub.add_parser("zones", help="zones with carbon data, providers and fallback status")
    zs.add_argument("--json", action="store_true", help=JSON_HELP)
    _db_flags(zs)

    register("carbon", run)


# -- run ----------------------------------------------------------------------------------

def run(args, config: dict) -> int:
    """Run one `carbon` action; raise scheduler.cli.common.CliError with one clear line on failure."""
    import logging


    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    from scheduler.carbon_config import CarbonConfig

    try:
        carbon_config = CarbonConfig.from_config(config)
    except (ValueError, TypeError) as e:
        raise CliError(f"config: {e}", EXIT_USAGE) from None
    action = {"import": _import, "show": _show, "zones": _zones, "forget": _forget}[args.carbon_action]
    return action(args, config, carbon_config)


def _open(args, config, *, create: bool):
    """The store, or None when there is no carbon database yet and `create` is False.

    An empty database is migrated when `create`; one at another revision is refused.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from scheduler.store import SchemaError, Store

    if not create and _is_missing_sqlite(args, config):
        from scheduler.cli.common import missing_sqlite_path

        raise CliError(f"no database at {missing_sqlite_path(db_url(args, config))} "
                       "(import a trace first: carbonsched carbon import FILE --zone Z, or give --db URL)")
    try:
        store = Store(db_url(args, config))
    except (SQLAlchemyError, ImportError, ValueError) as e:
        raise CliError(f"cannot open the database: {type(e).__name__}: {e}") from None
    try:
        if store.is_empty():
            if not create:
                store.dispose()
                return None
            store.upgrade()
        else:
            store.require_current(f"carbonsched db upgrade --db {store.url}")
    except SchemaError as e:
        store.dispose()
        raise CliError(str(e)) from None
    except SQLAlchemyError as e:
        store.dispose()
        raise CliError(f"database {store.url}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    return store


def _iso(t: datetime | None) -> str | None:
    from scheduler.timeparse import iso

    return iso(t)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _local(t: datetime | None, with_date: bool = True) -> str:
    from scheduler.cli.output import local_time

    return local_time(_iso(t), with_date)


def _progress_printer(path: str):
    """A progress bar on stderr for big files when stderr is a terminal, else None."""
    import os

    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if size < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        return None
    name = os.path.basename(path)

    def show(phase: str, done: int, total: int) -> None:
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{name}: {phase:<5} [{bar:<30}] {frac:4.0%}")
        if phase == "store" and done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


# -- import -------------------------------------------------------------------------------

def _import(args, config, carbon_config) -> int:
    from scheduler.carbon import CarbonSignals
    from telemetry.grid.readings import CsvFormatError

    if args.fmt is None:
        from telemetry.grid.day_ahead import sniff_layout

        if sniff_layout(args.file) is not None:
            return _import_day_ahead(args, config)
    store = _open(args, config, create=True)
    try:
        signals = CarbonSignals(store, carbon_config, track_status=False)
        try:
            result = signals.writes.import_file(args.file, fmt=args.fmt, zone=args.zone, tz=args.timezone,
                                         progress=_progress_printer(args.file), as_forecast=args.as_forecast)
        except CsvFormatError as e:
            raise CliError(f"cannot import {e}", EXIT_USAGE) from None
        except ValueError as e:
            raise CliError(f"cannot import {args.file}: {e}", EXIT_USAGE) from None
    finally:
        store.dispose()
    if args.json:
        _print_json({"file": result.path, "format": result.fmt, "zones": result.zones,
                     "signals": result.signals, "rows_read": result.rows_read,
                     "rows_stored": result.rows_stored, "duplicates": result.duplicates,
                     "conflicting_duplicates": result.conflicting_duplicates,
                     "out_of_order": result.out_of_order, "empty_values": result.missing,
                     "first": _iso(result.first), "last": _iso(result.last),
                     "elapsed_s": round(result.elapsed_s, 3), "db": store.url,
                     "future_values": result.future_values, "future_first": _iso(result.future_first),
                     "future_last": _iso(result.future_last),
                     "future_stored_as": ("forecast" if result.as_forecast else "actual")
                     if result.future_values else None,
                     "imported_at": _iso(result.imported_at), "step_s": result.step_s})
        return EXIT_OK
    if not result.rows_stored:
        print(f"{result.path}: no values to import ({result.missing} empty values)")
        return EXIT_OK
    notes = []
    if result.duplicates:
        notes.append(f"{result.duplicates} repeated timestamps kept the last row"
                     + (f" ({result.conflicting_duplicates} with different values)"
                        if result.conflicting_duplicates else ""))
    if result.out_of_order:
        notes.append(f"{result.out_of_order} rows out of order (sorted)")
    if result.missing:
        notes.append(f"{result.missing} empty values skipped as gaps")
    steps = sorted(set(result.step_s.values()))
    step = "/".join(_step(s) for s in steps) + " steps, " if steps else ""
    print(f"imported {result.rows_stored:,} values for {', '.join(result.zones)} "
          f"({', '.join(result.signals)} signal, {step}{result.fmt} format) from {_iso(result.first)} "
          f"to {_iso(result.last)} in {result.elapsed_s:.2f} s")
    for note in notes:
        print(f"  note: {note}")
    for line in _future_lines(result):
        print(line)
    return EXIT_OK


def _import_day_ahead(args, config) -> int:
    """Import a day-ahead wind and solar forecast file (either layout) for --zone."""
    from scheduler.grid_forecasts import import_day_ahead
    from telemetry.grid.day_ahead import PUBLICATION_HOUR, publication_tz
    from telemetry.grid.readings import CsvFormatError

    if not args.zone:
        raise CliError(f"cannot import {args.file}: a day-ahead wind and solar forecast file names no zone; "
                       "give --zone Z", EXIT_USAGE)
    if args.as_forecast:
        raise CliError(f"cannot import {args.file}: --as-forecast is for carbon-intensity traces; day-ahead "
                       "forecasts are always stored as issued the day before", EXIT_USAGE)
    store = _open(args, config, create=True)
    try:
        try:
            result = import_day_ahead(store, args.file, args.zone)
        except CsvFormatError as e:
            raise CliError(f"cannot import {e}", EXIT_USAGE) from None
    finally:
        store.dispose()
    known_from = f"{PUBLICATION_HOUR}:00 {publication_tz(result.zone).key} the day before"
    if args.json:
        _print_json({"file": result.path, "kind": "day_ahead_wind_solar", "layout": result.layout,
                     "source": result.source, "zone": result.zone, "area": result.area,
                     "production_types": result.production_types, "hours": result.hours,
                     "first": _iso(result.first), "last": _iso(result.last), "mtu_s": result.mtu_s,
                     "imputed_hours": result.imputed, "fixes": result.fixes, "trimmed_rows": result.trimmed_rows,
                     "known_from": known_from, "first_issued_at": _iso(result.first_issued_at),
                     "imported_at": _iso(result.imported_at), "elapsed_s": round(result.elapsed_s, 3),
                     "db": store.url})
        return EXIT_OK
    mtu = _step(result.mtu_s)
    layout = (f"ENTSO-E export{' ' + result.area if result.area else ''}: {mtu} MTUs"
              if result.layout != "carboncast"
              else f"`UTC time,solar,wind` layout: sums of {3600 // result.mtu_s} {mtu} MTUs per hour")
    types = result.production_types
    what = ("wind and solar" if types in (["solar", "wind"], ["solar", "wind_onshore", "wind_offshore"])
            else " and ".join(t.replace("_", " ") for t in types))
    print(f"imported {result.hours:,} hours of day-ahead {what} forecasts for {result.zone} "
          f"({layout}, stored as hourly mean MW) from {_iso(result.first)} to {_iso(result.last)}, "
          f"each day known from {known_from}")
    for fix in result.fixes:
        print(f"  fixed: {fix}")
    if result.imputed:
        print(f"  note: {result.imputed} hours were filled in by the file's source (values not whole numbers): "
              "stored, flagged as imputed")
    if bool(set(types) & {"wind_onshore", "wind_offshore"}) and not {"wind_onshore", "wind_offshore"} <= set(types):
        print("  note: an hour's wind is known once both its onshore and offshore forecasts are imported")
    if result.trimmed_rows:
        print(f"  note: {result.trimmed_rows} empty rows at the start or end (not published yet) skipped")
    return EXIT_OK


def _step(seconds: int) -> str:
    return f"{seconds // 3600} h" if seconds % 3600 == 0 else f"{seconds // 60} min" if seconds % 60 == 0 \
        else f"{seconds} s"


def _future_lines(result) -> list[str]:
    """What became of the imported values that lie in the future (issue 16: they were
    silently stored as actuals that are "not known yet")."""
    n = result.future_values
    if not n:
        return []
    span = f"{_iso(result.future_first)} .. {_iso(result.future_last)}"
    if result.as_forecast:
        return [f"  {n:,} of them lie in the future ({span}): stored as a forecast issued now "
                f"({_iso(result.imported_at)}), used by the next plan and by `carbon show`"]
    return [f"  warning: {n:,} of them lie in the future ({span}) and have no issued_at: stored as "
            "actuals, which count as known only once each period is over, so no plan and no "
            "`carbon show` uses them before then",
            "  to use them as a forecast now, import again with --as-forecast (or add an issued_at column)"]


# -- show ---------------------------------------------------------------------------------

def _point_dict(p) -> dict:
    return {"at": _iso(p.at), "until": _iso(p.until), "gco2_per_kwh": round(p.gco2_per_kwh, 2),
            "kind": p.kind, "source": p.source, "issued_at": _iso(p.issued_at)}


def _age(seconds: float | None) -> str:
    from scheduler.timeparse import format_duration

    if seconds is None:
        return "-"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} d"
    return format_duration(seconds)


def _show(args, config, carbon_config) -> int:
    from scheduler.carbon import CarbonSignals
    from scheduler.timeparse import parse_time
    from telemetry.grid.static import static_intensity

    now = datetime.now(timezone.utc)
    try:
        at = parse_time(args.at, now) if args.at else now
        as_of = parse_time(args.as_of, now) if args.as_of else now
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    if not 0 < args.hours <= 24 * 14:
        raise CliError("--hours must be more than 0 and at most 336", EXIT_USAGE)
    store = _open(args, config, create=False)
    if store is None:
        raise CliError("no carbon data yet: the database is empty; import a trace first "
                       "(carbonsched carbon import FILE)")
    try:
        signals = CarbonSignals(store, carbon_config, track_status=False)
        refresh = None
        if args.refresh:
            refresh = signals.providers.refresh(args.zone)
            for endpoint, error in refresh.errors.items():
                print(f"carbonsched: warning: {refresh.provider} {endpoint}: {error}", file=sys.stderr)
        signal = args.signal or signals.signal_of(args.zone)
        known = signals.zones()
        if signal is None and static_intensity(args.zone, carbon_config.static) is None \
                and not any(z["zone"] == args.zone for z in known):
            names = [z["zone"] for z in known]
            hint = _zone_hint(args.zone, names)
            raise CliError(f"no carbon data for zone {args.zone!r} ({hint}zones with data: "
                           f"{', '.join(names) or 'none yet'})", EXIT_USAGE)
        fc = signals.forecast(args.zone, at, at + timedelta(hours=args.hours), as_of=as_of, signal=signal)
        current = signals.intensity(args.zone, at, signal=fc.signal, as_of=as_of)
        fresh = signals.freshness(args.zone, fc.signal, now=as_of)
        status = signals.zone_status(args.zone)
    finally:
        store.dispose()
    if current is not None:
        value = {"gco2_per_kwh": current.gco2_per_kwh, "kind": current.kind, "source": current.source,
                 "valid_from": current.valid_from, "valid_until": current.valid_until,
                 "issued_at": current.issued_at, "estimated": current.estimated}
    else:
        first = next((p for p in fc.points if p.at <= at < p.until), None)
        value = {"gco2_per_kwh": first.gco2_per_kwh if first else None, "kind": first.kind if first else None,
                 "source": first.source if first else None, "valid_from": first.at if first else None,
                 "valid_until": first.until if first else None,
                 "issued_at": first.issued_at if first else None, "estimated": None}
    static = static_intensity(args.zone, carbon_config.static)
    if args.json:
        _print_json({
            "zone": args.zone, "at": _iso(at), "gco2_per_kwh": value["gco2_per_kwh"], "kind": value["kind"],
            "signal": fc.signal, "source": value["source"], "valid_from": _iso(value["valid_from"]),
            "valid_until": _iso(value["valid_until"]), "issued_at": _iso(value["issued_at"]),
            "estimated": value["estimated"], "as_of": _iso(as_of), "hours": args.hours,
            "forecast": [_point_dict(p) for p in fc.points],
            "forecast_level": fc.level, "forecast_source": fc.source,
            "forecast_expected_mape_pct": fc.expected_mape_pct, "forecast_reason": fc.reason,
            "forecast_method": fc.method,
            "gaps": [{"start": _iso(a), "end": _iso(b)} for a, b in fc.gaps],
            "freshness": {
                "latest_actual_at": _iso(fresh["latest_actual_at"]),
                "latest_actual_until": _iso(fresh["latest_actual_until"]),
                "latest_actual_age_s": fresh["latest_actual_age_s"],
                "latest_actual_source": fresh["latest_actual_source"],
                "latest_forecast_issued_at": _iso(fresh["latest_forecast_issued_at"]),
                "forecast_age_s": fresh["forecast_age_s"],
                "fetches": [{**f, **{k: _iso(f[k]) for k in ("last_attempt_at", "last_success_at",
                                                             "next_allowed_at")}} for f in fresh["fetches"]],
            },
            "status": None if status is None else {**status, "since": _iso(status["since"])},
            "static": None if static is None else {"gco2_per_kwh": static.gco2_per_kwh, "basis": static.basis},
            "refresh": None if refresh is None else {"fetched": refresh.fetched, "skipped": refresh.skipped,
                                                     "errors": refresh.errors},
        })
        return EXIT_OK
    print(_show_text(args, at, as_of, now, value, fc, fresh, status, static))
    return EXIT_OK


def _zone_hint(zone: str, names: list[str]) -> str:
    """'did you mean 'DE'? ' where a known zone differs only in case or is a close spelling."""
    import difflib

    same = [n for n in names if n.casefold() == zone.casefold()]
    close = same or difflib.get_close_matches(zone.upper(), names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def _show_text(args, at, as_of, now, value, fc, fresh, status, static) -> str:
    from scheduler.text_table import table

    lines = [f"zone {args.zone} ({fc.signal} signal), at {_local(at)}"
             + (f", as known at {_local(as_of)}" if abs((as_of - now).total_seconds()) > 60 else "")]
    if value["gco2_per_kwh"] is None:
        lines.append("value:    no data (a gap: nothing recorded, forecast or static for this time)")
    else:
        kind = value["kind"] + (" (STATIC yearly average, not live data)" if value["kind"] == "static" else "")
        lines.append(f"value:    {value['gco2_per_kwh']:.1f} gCO2eq/kWh, {kind} from {value['source']}, "
                     f"{_local(value['valid_from'])} to {_local(value['valid_until'])}"
                     + (" (estimated by the provider)" if value["estimated"] else ""))
    if fresh["latest_actual_at"]:
        lines.append(f"record:   newest actual {_local(fresh['latest_actual_at'])} from "
                     f"{fresh['latest_actual_source']}, {_age(fresh['latest_actual_age_s'])} old")
    else:
        lines.append("record:   no actual values")
    lines.append("forecast: " + (f"newest provider forecast issued {_local(fresh['latest_forecast_issued_at'])}, "
                                 f"{_age(fresh['forecast_age_s'])} old"
                                 if fresh["latest_forecast_issued_at"] else "no provider forecast stored"))
    for f in fresh["fetches"]:
        state = (f"failing ({f['failures']}x): {f['last_error']}" if f["failures"]
                 else f"ok, last success {_local(f['last_success_at'])}")
        lines.append(f"provider: {f['provider']} {f['endpoint']}: {state}; {f['calls']} calls")
    quality = f", expected error ~{fc.expected_mape_pct:g}% MAPE" if fc.expected_mape_pct else ""
    lines.append(f"next {args.hours:g} h from {fc.source} ({fc.level} level{quality})")
    if fc.level in ("own", "static", "none") and fc.reason:
        lines.append(f"  downgraded: {fc.reason}")
    if static is not None and fc.level == "static":
        lines.append(f"  static value {static.gco2_per_kwh:g} gCO2eq/kWh: {static.basis}")
    if status is not None:
        lines.append(f"  daemon status: {status['level']} since {_local(status['since'])}"
                     + (f" ({status['reason']})" if status["reason"] else ""))
    rows = [[_local(p.at), f"{p.gco2_per_kwh:.1f}", p.kind, p.source] for p in fc.points]
    if rows:
        values = [p.gco2_per_kwh for p in fc.points]
        lines.append(f"  min {min(values):.1f}, max {max(values):.1f} gCO2eq/kWh")
        lines.append("")
        lines.append(table(["FROM", "GCO2/KWH", "KIND", "SOURCE"], rows))
    lines.append("gaps: " + ("none" if not fc.gaps else
                             ", ".join(f"{_local(a)} to {_local(b)}" for a, b in fc.gaps)))
    return "\n".join(lines)


# -- forget -------------------------------------------------------------------------------

def _forget(args, config, carbon_config) -> int:
    from scheduler.carbon import CarbonSignals

    store = _open(args, config, create=False)
    if store is None:
        raise CliError("no carbon data yet: the database is empty")
    from scheduler.grid_forecasts import day_ahead_zones, forget_day_ahead

    try:
        signals = CarbonSignals(store, carbon_config, track_status=False)
        carbon_zones = [z["zone"] for z in signals.zones()]
        forecast_zones = day_ahead_zones(store)
        if args.zone not in carbon_zones and args.zone not in forecast_zones:
            names = ", ".join(sorted(set(carbon_zones) | set(forecast_zones))) or "none"
            raise CliError(f"no carbon data for zone {args.zone!r} (zones with data: {names})", EXIT_USAGE)
        n = signals.writes.forget_zone(args.zone) if args.zone in carbon_zones else 0
        day_ahead = forget_day_ahead(store, args.zone) if args.zone in forecast_zones else 0
    finally:
        store.dispose()
    if args.json:
        _print_json({"zone": args.zone, "values_deleted": n, "day_ahead_values_deleted": day_ahead})
    else:
        parts = ([f"{n:,} values"] if n or not day_ahead else []) \
            + ([f"{day_ahead:,} day-ahead wind and solar forecast values"] if day_ahead else [])
        print(f"deleted {' and '.join(parts)} of zone {args.zone}")
    return EXIT_OK


# -- zones --------------------------------------------------------------------------------

def _zones(args, config, carbon_config) -> int:
    from scheduler.carbon import CarbonSignals
    from scheduler.text_table import table

    store = _open(args, config, create=False)
    zones: list[dict] = []
    if store is not None:
        try:
            zones = CarbonSignals(store, carbon_config, track_status=False).zones()
        finally:
            store.dispose()
    if args.json:
        out = []
        for z in zones:
            status = z["status"]
            out.append({**z, **{k: _iso(z[k]) for k in ("first_actual_at", "last_actual_at",
                                                          "last_forecast_issued_at")},
                        "status": None if status is None else {**status, "since": _iso(status["since"])}})
        _print_json(out)
        return EXIT_OK
    if not zones:
        print("no zones: import a trace (carbonsched carbon import FILE) or configure [carbon.zones]")
        return EXIT_OK
    rows = []
    for z in zones:
        st = z["status"]["level"] if z["status"] else "-"
        rows.append([z["zone"], ",".join(z["signals"]) or "-", ",".join(z["sources"]) or "-",
                     f"{z['actual_rows']:,}", _local(z["first_actual_at"]), _local(z["last_actual_at"]),
                     f"{z['forecast_rows']:,}", z["provider"] or "-",
                     "-" if z["static_gco2_per_kwh"] is None else f"{z['static_gco2_per_kwh']:g}", st])
    print(table(["ZONE", "SIGNAL", "SOURCES", "ACTUALS", "FROM", "TO", "FORECASTS", "PROVIDER",
                 "STATIC G/KWH", "STATUS"], rows))
    return EXIT_OK


def _is_missing_sqlite(args, config) -> bool:
    """Whether the database is a SQLite file that does not exist yet (nothing imported)."""
    from pathlib import Path


    url = db_url(args, config)
    if not url.startswith("sqlite:///"):
        return False
    path = url[len("sqlite:///"):]
    return path not in ("", ":memory:") and not Path(path).exists()
