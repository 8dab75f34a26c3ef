"""One carbon interface (`scheduler.carbon_signal.CarbonSignal`) over live and replayed signals,
one curve builder (`scheduler.carbon_curves.zone_curve`), one provider registry."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from scheduler.carbon import CarbonSignals
from scheduler.carbon_curves import zone_curve
from scheduler.carbon_providers import DEFAULT_MIN_INTERVAL_S, PROVIDER_SIGNAL, PROVIDERS, provider
from scheduler.carbon_signal import CarbonSignal
from scheduler.simulate.forecasts import parse_forecast
from scheduler.simulate.intensity import FineSeries, from_hourly
from telemetry.grid.readings import GridConfigError, IntensityReading

T = datetime(2022, 3, 1, tzinfo=timezone.utc)
FIRST_HOUR = int(T.timestamp() // 3600) - 24 * 40


def _zones(fine: bool = False):
    hourly = {FIRST_HOUR + i: 200.0 + 50.0 * np.sin(i / 3.0) for i in range(24 * 60)}
    z = from_hourly("DE", hourly, signal="average", source="test trace")
    if fine:
        z.fine = FineSeries(step_s=1800.0, first=FIRST_HOUR * 2,
                            values_g_per_kwh=np.repeat(list(hourly.values()), 2) * np.tile([0.9, 1.1], len(hourly)))
    return {"DE": z}


def _implements(signal: CarbonSignal) -> bool:
    return all(callable(getattr(signal, m, None)) for m in ("signal_of", "intensity", "forecast", "climatology"))


@pytest.mark.parametrize("spec,fine", [("perfect", False), ("noisy:0.1", False), ("baseline", False),
                                       ("perfect", True), ("baseline", True)])
def test_the_simulator_s_curve_is_zone_curve_of_its_replayed_forecast(spec, fine):
    model = parse_forecast(spec, _zones(fine))
    assert _implements(model)
    now_s = T.timestamp() + 1234.5
    curve = model.curve("DE", now_s, 48 * 3600.0)
    step = 1800.0 if fine else 3600.0
    start = datetime.fromtimestamp(now_s // step * step, timezone.utc)
    again = parse_forecast(spec, _zones(fine))
    fc = again.forecast("DE", start, start + timedelta(seconds=len(curve.values_g_per_kwh) * step),
                        as_of=datetime.fromtimestamp(now_s, timezone.utc))
    built = zone_curve(again, fc, step)
    assert built == curve
    assert curve.tail is not None and "the DE trace" in curve.tail.source


def test_a_replayed_value_is_known_only_once_its_hour_has_ended():
    model = parse_forecast("perfect", _zones())
    t = T + timedelta(minutes=30)
    assert model.intensity("DE", t, as_of=t) is None
    v = model.intensity("DE", t, as_of=T + timedelta(hours=1))
    assert v is not None and v.gco2_per_kwh == model.zones["DE"].value_at(t.timestamp())
    assert v.valid_from == T and v.valid_until == T + timedelta(hours=1)
    assert model.intensity("DE", t, signal="marginal") is None
    assert model.signal_of("DE") == "average" and model.signal_of("XX") is None


def test_without_climatology_a_replayed_curve_has_no_tail():
    model = parse_forecast("perfect", _zones())
    model.with_climatology = False
    assert model.curve("DE", T.timestamp(), 24 * 3600.0).tail is None


def test_the_live_signals_build_their_curves_through_the_same_function(store):
    signals = CarbonSignals(store, track_status=False)
    assert _implements(signals)
    signals.writes.store_readings([
        IntensityReading(zone="DE", at=T - timedelta(days=10) + timedelta(hours=i), duration_s=3600,
                         gco2_per_kwh=100.0 + i % 24, signal="average", kind="actual",
                         issued_at=T - timedelta(days=10) + timedelta(hours=i + 1), source="test")
        for i in range(10 * 24 + 12)])
    fc = signals.forecast("DE", T, T + timedelta(hours=12), as_of=T + timedelta(hours=12))
    curve = zone_curve(signals, fc, 3600.0)
    assert curve is not None and curve.values_g_per_kwh == tuple(100.0 + h for h in range(12))
    assert curve.tail == signals.climatology("DE", "average", fc.as_of)


def test_providers_are_a_registry():
    assert PROVIDERS == ("electricitymaps", "watttime", "ukgrid")
    assert PROVIDER_SIGNAL == {"electricitymaps": "average", "watttime": "marginal", "ukgrid": "average"}
    assert DEFAULT_MIN_INTERVAL_S == {
        ("electricitymaps", "latest"): 900, ("electricitymaps", "history"): 3600,
        ("electricitymaps", "forecast"): 3600, ("watttime", "forecast"): 300, ("ukgrid", "fw48h"): 1800}
    assert [e for e, _, _ in provider("electricitymaps").endpoints] == ["history", "latest", "forecast"]
    with pytest.raises(GridConfigError, match="unknown carbon provider"):
        provider("nope")
