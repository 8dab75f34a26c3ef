"""Live carbon providers against a local HTTP server that answers like the real APIs.

The server (http.server on 127.0.0.1, in a thread) serves responses in the documented shapes
of Electricity Maps v3 (carbon-intensity latest/history/forecast), WattTime v3 (login,
signal-index, forecast) and the UK Carbon Intensity API (/intensity/{from}/fw48h), and
also errors, 429 rate limits, slow answers (timeouts) and garbage. Then the store side:
`CarbonSignals.providers.refresh` calls each endpoint at most once per interval across processes,
backs off after failures and 429s, and the forecast chain falls back on its own.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select

from scheduler.carbon import CarbonSignals
from scheduler.carbon_config import CarbonConfig, ZoneConfig
from scheduler.store.carbon_models import carbon_fetches
from telemetry.grid.electricitymaps import ElectricityMapsClient
from telemetry.grid.readings import (
    GridAuthError,
    GridBadResponse,
    GridConfigError,
    GridRateLimited,
    GridRequestError,
    GridUnavailable,
)
from telemetry.grid.ukgrid import UkCarbonIntensityClient
from telemetry.grid.watttime import WattTimeClient

UTC = timezone.utc
TOKEN = "em-secret-token-4711"
PASSWORD = "wt-secret-password-0815"
NOW = datetime(2024, 5, 1, 12, 10, tzinfo=UTC)


# -- a fake API server ----------------------------------------------------------------------

@dataclass
class Reply:
    status: int = 200
    body: object = None             # dict/list -> JSON; bytes/str -> sent as is
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Seen:
    path: str
    query: dict
    headers: dict   # names in lower case (HTTP header names are case-insensitive)


class FakeApi:
    """Routes path -> queue of replies (the last one repeats); records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, list[Reply]] = {}
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                with fake.lock:
                    fake.requests.append(Seen(parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()},
                                              {k.lower(): v for k, v in self.headers.items()}))
                    queue = fake.routes.get(parts.path)
                    if not queue:
                        reply = Reply(404, {"error": "no route"})
                    else:
                        reply = queue.pop(0) if len(queue) > 1 else queue[0]
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                body = reply.body
                data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str)
                                                             else json.dumps(body).encode())
                try:
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def on(self, path: str, *replies: Reply) -> None:
        self.routes[path] = list(replies)

    def calls(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()
    try:
        yield fake
    finally:
        fake.close()


def no_sleep(_s: float) -> None:
    pass


# -- documented response shapes -------------------------------------------------------------

def em_point(t: str, value, **extra) -> dict:
    return {"zone": "DE", "carbonIntensity": value, "datetime": t, "updatedAt": "2024-05-01T12:05:00.000Z",
            "createdAt": "2024-04-28T12:00:00.000Z", "emissionFactorType": "direct", "isEstimated": False,
            "estimationMethod": None, **extra}


EM_LATEST = em_point("2024-05-01T12:00:00.000Z", 302)
EM_HISTORY = {"zone": "DE", "history": [em_point("2024-05-01T10:00:00.000Z", 280),
                                        em_point("2024-05-01T11:00:00.000Z", 290, isEstimated=True)]}
EM_FORECAST = {"zone": "DE", "forecast": [{"carbonIntensity": 310, "datetime": "2024-05-01T13:00:00.000Z"},
                                          {"carbonIntensity": 305, "datetime": "2024-05-01T14:00:00.000Z"},
                                          {"carbonIntensity": 250, "datetime": "2024-05-01T12:00:00.000Z"}],
               "updatedAt": "2024-05-01T12:02:00.000Z"}
WT_LOGIN = {"token": "wt-jwt-token"}
WT_FORECAST = {"data": [{"point_time": "2024-05-01T12:10:00+00:00", "value": 1000.0},
                        {"point_time": "2024-05-01T12:15:00+00:00", "value": 900.0}],
               "meta": {"data_point_period_seconds": 300, "region": "CAISO_NORTH", "warnings": [],
                        "signal_type": "co2_moer", "model": {"date": "2023-03-01"},
                        "units": "lbs_co2_per_mwh", "generated_at_period_seconds": 300,
                        "generated_at": "2024-05-01T12:10:00+00:00"}}
WT_INDEX = {"data": [{"point_time": "2024-05-01T12:10:00+00:00", "value": 63.0}],
            "meta": {"region": "CAISO_NORTH", "signal_type": "co2_moer", "units": "percentile",
                     "data_point_period_seconds": 300, "warnings": [], "model": {"date": "2023-03-01"}}}


def uk_body(start: datetime, n: int, actual_until: datetime) -> dict:
    data = []
    for i in range(n):
        a = start + timedelta(minutes=30 * i)
        b = a + timedelta(minutes=30)
        data.append({"from": a.strftime("%Y-%m-%dT%H:%MZ"), "to": b.strftime("%Y-%m-%dT%H:%MZ"),
                     "intensity": {"forecast": 100 + i, "actual": 90 + i if b <= actual_until else None,
                                   "index": "low"}})
    return {"data": data}


def em_client(api: FakeApi, **kw) -> ElectricityMapsClient:
    return ElectricityMapsClient(TOKEN, base_url=api.url + "/v3", timeout_s=kw.pop("timeout_s", 2.0),
                                 retries=kw.pop("retries", 2), clock=lambda: NOW, sleep=no_sleep, **kw)


# -- Electricity Maps -----------------------------------------------------------------------

def test_electricitymaps_latest_history_and_forecast_in_the_documented_shapes(api):
    api.on("/v3/carbon-intensity/latest", Reply(body=EM_LATEST))
    api.on("/v3/carbon-intensity/history", Reply(body=EM_HISTORY))
    api.on("/v3/carbon-intensity/forecast", Reply(body=EM_FORECAST))
    c = em_client(api)
    latest = c.latest("DE")
    assert (latest.zone, latest.at, latest.gco2_per_kwh) == ("DE", datetime(2024, 5, 1, 12, tzinfo=UTC), 302)
    assert (latest.kind, latest.signal, latest.source, latest.duration_s) == ("actual", "average",
                                                                               "electricitymaps", 3600)
    assert latest.issued_at == datetime(2024, 5, 1, 12, 5, tzinfo=UTC)      # its updatedAt
    history = c.history("DE")
    assert [r.gco2_per_kwh for r in history] == [280, 290]
    assert [r.estimated for r in history] == [False, True]
    forecast = c.forecast("DE", horizon_hours=48)
    assert [r.at.hour for r in forecast] == [12, 13, 14]                    # sorted
    assert {r.kind for r in forecast} == {"forecast"}
    assert {r.issued_at for r in forecast} == {datetime(2024, 5, 1, 12, 2, tzinfo=UTC)}
    seen = api.requests[-1]
    assert seen.headers.get("auth-token") == TOKEN
    assert seen.query == {"zone": "DE", "emissionFactorType": "direct", "horizonHours": "48"}


def test_an_hour_without_a_value_is_a_gap_not_a_zero(api):
    api.on("/v3/carbon-intensity/history", Reply(body={"zone": "DE", "history": [
        em_point("2024-05-01T10:00:00.000Z", None), em_point("2024-05-01T11:00:00.000Z", 290)]}))
    assert [r.at.hour for r in em_client(api).history("DE")] == [11]


def test_refused_credentials_are_not_retried(api):
    api.on("/v3/carbon-intensity/latest", Reply(401, {"error": "Invalid auth-token"}))
    with pytest.raises(GridAuthError, match="Invalid auth-token"):
        em_client(api).latest("DE")
    assert api.calls("/v3/carbon-intensity/latest") == 1


def test_a_long_rate_limit_is_reported_with_its_wait_and_not_hammered(api):
    api.on("/v3/carbon-intensity/forecast", Reply(429, {"error": "Rate limit exceeded"}, {"Retry-After": "120"}))
    with pytest.raises(GridRateLimited) as e:
        em_client(api).forecast("DE")
    assert e.value.retry_after_s == 120
    assert api.calls("/v3/carbon-intensity/forecast") == 1


def test_a_short_rate_limit_and_server_errors_are_retried(api):
    api.on("/v3/carbon-intensity/latest", Reply(429, {"error": "slow down"}, {"Retry-After": "0"}),
           Reply(503, "<html>Service Unavailable</html>"), Reply(body=EM_LATEST))
    assert em_client(api).latest("DE").gco2_per_kwh == 302
    assert api.calls("/v3/carbon-intensity/latest") == 3


def test_persistent_server_errors_give_up_after_the_retries(api):
    api.on("/v3/carbon-intensity/latest", Reply(502, "bad gateway"))
    with pytest.raises(GridUnavailable, match="3 attempts.*HTTP 502"):
        em_client(api, retries=2).latest("DE")
    assert api.calls("/v3/carbon-intensity/latest") == 3


def test_a_slow_server_times_out_within_the_deadline(api):
    api.on("/v3/carbon-intensity/latest", Reply(body=EM_LATEST, delay_s=1.5))
    t0 = time.monotonic()
    with pytest.raises(GridUnavailable, match="timeout"):
        em_client(api, timeout_s=0.2, retries=1).latest("DE")
    assert time.monotonic() - t0 < 1.2
    assert api.calls("/v3/carbon-intensity/latest") == 2


def test_a_refused_connection_is_unavailable(api):
    url = api.url
    api.close()
    client = ElectricityMapsClient(TOKEN, base_url=url + "/v3", timeout_s=0.5, retries=1, sleep=no_sleep)
    with pytest.raises(GridUnavailable, match="connection failed"):
        client.latest("DE")


@pytest.mark.parametrize("reply", [
    Reply(body=b"<html>maintenance</html>"),                                   # not JSON
    Reply(body=b"\xff\xfe garbage"),                                           # not even text
    Reply(body=[1, 2, 3]),                                                     # wrong JSON type
    Reply(body={"zone": "DE", "history": "soon"}),                             # wrong shape
    Reply(body={"zone": "DE", "history": [{"datetime": "2024-05-01T10:00:00Z"}]}),  # missing value
    Reply(body={"zone": "DE", "history": [em_point("yesterday", 5)]}),         # bad time
    Reply(body={"zone": "DE", "history": [em_point("2024-05-01T10:00:00Z", "many")]}),  # bad number
    Reply(body={"zone": "DE", "history": [em_point("2024-05-01T10:00:00Z", -3)]}),      # impossible
])
def test_garbage_is_a_bad_response(api, reply):
    api.on("/v3/carbon-intensity/history", reply)
    with pytest.raises(GridBadResponse):
        em_client(api).history("DE")


def test_an_unknown_zone_is_a_request_error_with_the_apis_message(api):
    api.on("/v3/carbon-intensity/latest", Reply(404, {"error": "Zone 'XX' does not exist"}))
    with pytest.raises(GridRequestError, match="Zone 'XX' does not exist") as e:
        em_client(api).latest("XX")
    assert e.value.status == 404


def test_the_token_never_appears_in_logs_errors_or_repr(api, caplog):
    caplog.set_level(logging.DEBUG)
    api.on("/v3/carbon-intensity/latest", Reply(500, "oops"), Reply(401, {"error": "denied"}))
    client = em_client(api)
    with pytest.raises(GridAuthError) as e:
        client.latest("DE")
    assert TOKEN not in str(e.value)
    assert TOKEN not in repr(client)
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    with pytest.raises(GridConfigError):
        ElectricityMapsClient("")


# -- WattTime -------------------------------------------------------------------------------

def wt_client(api: FakeApi, clock=lambda: NOW) -> WattTimeClient:
    return WattTimeClient("alice", PASSWORD, base_url=api.url, timeout_s=2.0, retries=1, clock=clock,
                          sleep=no_sleep)


def test_watttime_logs_in_with_basic_auth_and_converts_the_moer_forecast(api):
    api.on("/login", Reply(body=WT_LOGIN))
    api.on("/v3/forecast", Reply(body=WT_FORECAST))
    readings = wt_client(api).forecast("CAISO_NORTH", horizon_hours=24)
    login = next(r for r in api.requests if r.path == "/login")
    assert base64.b64decode(login.headers["authorization"].split()[1]).decode() == f"alice:{PASSWORD}"
    data = next(r for r in api.requests if r.path == "/v3/forecast")
    assert data.headers["authorization"] == "Bearer wt-jwt-token"
    assert data.query == {"region": "CAISO_NORTH", "signal_type": "co2_moer", "horizon_hours": "24"}
    assert [r.gco2_per_kwh for r in readings] == pytest.approx([453.59237, 408.233133])
    assert {(r.signal, r.kind, r.duration_s) for r in readings} == {("marginal", "forecast", 300)}
    assert readings[0].issued_at == datetime(2024, 5, 1, 12, 10, tzinfo=UTC)


def test_watttime_signal_index_is_a_percentile_not_an_intensity(api):
    api.on("/login", Reply(body=WT_LOGIN))
    api.on("/v3/signal-index", Reply(body=WT_INDEX))
    index = wt_client(api).signal_index("CAISO_NORTH")
    assert (index.value, index.units, index.signal_type) == (63.0, "percentile", "co2_moer")


def test_watttime_reuses_its_token_and_logs_in_again_when_it_expires(api):
    now = [NOW]
    api.on("/login", Reply(body=WT_LOGIN))
    api.on("/v3/forecast", Reply(body=WT_FORECAST))
    client = wt_client(api, clock=lambda: now[0])
    client.forecast("CAISO_NORTH")
    client.forecast("CAISO_NORTH")
    assert api.calls("/login") == 1
    now[0] += timedelta(minutes=31)
    client.forecast("CAISO_NORTH")
    assert api.calls("/login") == 2


def test_watttime_logs_in_once_more_on_a_401_then_gives_up(api):
    api.on("/login", Reply(body=WT_LOGIN))
    api.on("/v3/forecast", Reply(401, {"error": "token expired"}), Reply(body=WT_FORECAST))
    assert len(wt_client(api).forecast("CAISO_NORTH")) == 2
    assert api.calls("/login") == 2
    api.on("/v3/forecast", Reply(401, {"error": "token expired"}))
    with pytest.raises(GridAuthError):
        wt_client(api).forecast("CAISO_NORTH")


@pytest.mark.parametrize(("path", "reply", "error"), [
    ("/login", Reply(401, {"error": "bad credentials"}), GridAuthError),
    ("/login", Reply(body={"no": "token"}), GridBadResponse),
    ("/v3/forecast", Reply(body={**WT_FORECAST, "meta": {**WT_FORECAST["meta"], "units": "percentile"}}),
     GridBadResponse),
    ("/v3/forecast", Reply(body={"meta": {}}), GridBadResponse),
])
def test_watttime_errors(api, path, reply, error):
    api.on("/login", Reply(body=WT_LOGIN))
    api.on("/v3/forecast", Reply(body=WT_FORECAST))
    api.on(path, reply)
    with pytest.raises(error):
        wt_client(api).forecast("CAISO_NORTH")


def test_watttime_password_is_hidden():
    client = WattTimeClient("alice", PASSWORD)
    assert PASSWORD not in repr(client)


# -- UK Carbon Intensity API ----------------------------------------------------------------

def test_uk_fw48h_gives_half_hour_forecasts_and_the_actuals_already_measured(api):
    start = datetime(2024, 5, 1, 11, 0, tzinfo=UTC)
    api.on("/intensity/2024-05-01T12:10Z/fw48h", Reply(body=uk_body(start, 6, actual_until=NOW)))
    client = UkCarbonIntensityClient(base_url=api.url, clock=lambda: NOW, sleep=no_sleep)
    readings = client.forecast_48h()
    forecasts = [r for r in readings if r.kind == "forecast"]
    actuals = [r for r in readings if r.kind == "actual"]
    assert len(forecasts) == 6 and {r.duration_s for r in readings} == {1800}
    assert [(r.at.hour, r.at.minute, r.gco2_per_kwh) for r in actuals] == [(11, 0, 90), (11, 30, 91)]
    assert {(r.zone, r.signal, r.source) for r in readings} == {("GB", "average", "ukgrid")}
    assert {r.issued_at for r in forecasts} == {NOW}


def test_uk_errors_carry_the_apis_message(api):
    api.on("/intensity/2024-05-01T12:10Z/fw48h",
           Reply(400, {"error": {"code": "400 Bad Request", "message": "Please enter a valid date"}}))
    client = UkCarbonIntensityClient(base_url=api.url, clock=lambda: NOW, sleep=no_sleep)
    with pytest.raises(GridRequestError, match="Please enter a valid date"):
        client.forecast_48h()
    api.on("/intensity/2024-05-01T12:10Z/fw48h", Reply(body={"data": [{"from": "x"}]}))
    with pytest.raises(GridBadResponse):
        client.forecast_48h()


# -- refresh(): the store as the cache and call budget --------------------------------------

def em_config(api: FakeApi, **zone) -> CarbonConfig:
    return CarbonConfig(zones={"DE": ZoneConfig("DE", provider="electricitymaps", **zone)},
                        electricitymaps_token=TOKEN, electricitymaps_url=api.url + "/v3", retries=0,
                        timeout_s=2.0)


def serve_em(api: FakeApi) -> None:
    api.on("/v3/carbon-intensity/latest", Reply(body=EM_LATEST))
    api.on("/v3/carbon-intensity/history", Reply(body=EM_HISTORY))
    api.on("/v3/carbon-intensity/forecast", Reply(body=EM_FORECAST))


def test_refresh_stores_live_values_and_calls_each_endpoint_once_per_interval(api, store):
    serve_em(api)
    now = [NOW]
    s = CarbonSignals(store, em_config(api), clock=lambda: now[0], track_status=False)
    report = s.providers.refresh("DE")
    assert report.fetched == {"history": 2, "latest": 1, "forecast": 3} and not report.errors
    assert s.intensity("DE", datetime(2024, 5, 1, 11, 30, tzinfo=UTC)).source == "electricitymaps"
    fc = s.forecast("DE", NOW, NOW + timedelta(hours=2))
    assert fc.level == "live" and fc.source == "electricitymaps"
    # a second process a minute later: everything is cached, no HTTP call at all
    now[0] += timedelta(minutes=1)
    other = CarbonSignals(store, em_config(api), clock=lambda: now[0], track_status=False)
    calls = len(api.requests)
    again = other.providers.refresh("DE")
    assert len(api.requests) == calls
    assert set(again.skipped) == {"history", "latest", "forecast"}
    # after the latest endpoint's 15 min interval only that one is called again
    now[0] += timedelta(minutes=15)
    assert set(other.providers.refresh("DE").fetched) == {"latest"}


def test_a_rate_limit_is_respected_across_processes_even_when_forced(api, store):
    api.on("/v3/carbon-intensity/history", Reply(429, {"error": "Rate limit"}, {"Retry-After": "600"}))
    now = [NOW]
    config = em_config(api)
    config.zones["FR"] = ZoneConfig("FR", provider="electricitymaps")
    s = CarbonSignals(store, config, clock=lambda: now[0], track_status=False)
    report = s.providers.refresh("DE")
    assert "history" in report.errors and not report.fetched      # stops at the first 429
    assert api.calls("/v3/carbon-intensity/latest") == 0
    serve_em(api)
    assert "backing off electricitymaps" in s.providers.refresh("FR").skipped["history"]   # the whole account waits
    now[0] += timedelta(minutes=5)
    calls = len(api.requests)
    assert "backing off" in s.providers.refresh("DE", force=True).skipped["history"]
    assert len(api.requests) == calls
    now[0] += timedelta(minutes=6)
    assert s.providers.refresh("DE").fetched["history"] == 2


def test_a_failing_provider_is_recorded_and_the_forecast_falls_back(api, store, caplog):
    caplog.set_level(logging.DEBUG)
    api.on("/v3/carbon-intensity/history", Reply(500, "internal error"))
    api.on("/v3/carbon-intensity/latest", Reply(body=b"{not json"))
    api.on("/v3/carbon-intensity/forecast", Reply(401, {"error": "Invalid token"}))
    s = CarbonSignals(store, em_config(api), clock=lambda: NOW, track_status=False)
    report = s.providers.refresh("DE")
    assert set(report.errors) == {"history", "latest", "forecast"}
    with store.read() as conn:
        rows = {r.endpoint: r for r in conn.execute(select(carbon_fetches)).all()}
    assert rows["*"].next_allowed_at == NOW + timedelta(hours=1)
    assert rows["history"].failures == 1 and "HTTP 500" in rows["history"].last_error
    assert rows["forecast"].next_allowed_at == NOW + timedelta(hours=1)   # auth: back off an hour
    fc = s.forecast("DE", NOW, NOW + timedelta(hours=24))
    assert fc.level == "static" and fc.complete and "no electricitymaps forecast" in fc.reason
    fresh = s.freshness("DE", now=NOW)
    assert {f["endpoint"]: f["failures"] for f in fresh["fetches"]} == {
        "forecast": 1, "history": 1, "latest": 1, "*": 1}          # "*": the whole account backs off
    everything = " ".join(r.getMessage() for r in caplog.records) + " ".join(
        str(r.last_error) for r in rows.values())
    assert TOKEN not in everything


def test_a_provider_region_is_stored_under_the_zone_name(api, store):
    api.on("/login", Reply(body=WT_LOGIN))
    api.on("/v3/forecast", Reply(body=WT_FORECAST))
    config = CarbonConfig(zones={"us-west": ZoneConfig("us-west", provider="watttime", region="CAISO_NORTH")},
                          watttime_username="alice", watttime_password=PASSWORD, watttime_url=api.url)
    s = CarbonSignals(store, config, clock=lambda: NOW, track_status=False)
    assert s.providers.refresh("us-west").fetched == {"forecast": 2}
    assert s.signal_of("us-west") == "marginal"
    fc = s.forecast("us-west", NOW, NOW + timedelta(minutes=10))
    assert fc.level == "live" and [p.gco2_per_kwh for p in fc.points] == pytest.approx([453.59237, 408.233133])


def test_a_zone_without_provider_or_credentials_is_reported_not_raised(store):
    s = CarbonSignals(store, CarbonConfig(zones={"DE": ZoneConfig("DE", provider="electricitymaps")}),
                      clock=lambda: NOW, track_status=False)
    assert s.providers.refresh("FR").skipped == {"*": "no live provider configured"}
    report = s.providers.refresh("DE")
    assert "API token" in report.errors["history"]


def test_credentials_come_from_the_environment_before_the_config_file():
    cfg = CarbonConfig.from_config(
        {"carbon": {"electricitymaps_token": "from-file", "watttime_username": "u",
                    "zones": {"DE": {"provider": "electricitymaps"}, "GB": {"provider": "ukgrid"}},
                    "min_interval": {"electricitymaps.forecast": "30m"}, "static": {"FR": 56}}},
        env={"CARBONSCHED_ELECTRICITYMAPS_TOKEN": "from-env", "CARBONSCHED_WATTTIME_PASSWORD": "pw"})
    assert cfg.electricitymaps_token == "from-env"
    assert (cfg.watttime_username, cfg.watttime_password) == ("u", "pw")
    assert cfg.zones["GB"].provider == "ukgrid"
    assert cfg.min_interval_s[("electricitymaps", "forecast")] == 1800
    assert cfg.static == {"FR": 56.0}
    assert "from-env" not in repr(cfg) and "pw" not in repr(cfg).replace("provider", "")
    with pytest.raises(ValueError, match="provider"):
        CarbonConfig.from_config({"carbon": {"zones": {"DE": {"provider": "carbonara"}}}}, env={})
