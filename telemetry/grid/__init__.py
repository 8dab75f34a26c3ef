"""Grid carbon intensity: trace files, live providers, the static table and a baseline forecaster.

Everything here returns plain readings (`IntensityReading`) and raises `GridError`s; the
scheduler (`scheduler.carbon`) stores them and answers intensity/forecast queries.
Modules: `readings` (dataclasses, errors, units), `http` (GET with timeouts and retries),
`csv_import`, `day_ahead` (grid operators' day-ahead wind and solar
forecast files, hourly MW), `electricitymaps`, `watttime`, `ukgrid`, `static`, `forecast`.
"""

from telemetry.grid.readings import (
    KIND_ACTUAL,
    KIND_FORECAST,
    SIGNAL_AVERAGE,
    SIGNAL_MARGINAL,
    CsvFormatError,
    GridAuthError,
    GridBadResponse,
    GridConfigError,
    GridError,
    GridRateLimited,
    GridRequestError,
    GridUnavailable,
    IntensityReading,
    SignalIndexReading,
)

__all__ = [
    "KIND_ACTUAL", "KIND_FORECAST", "SIGNAL_AVERAGE", "SIGNAL_MARGINAL", "CsvFormatError",
    "GridAuthError", "GridBadResponse", "GridConfigError", "GridError", "GridRateLimited",
    "GridRequestError", "GridUnavailable", "IntensityReading", "SignalIndexReading",
]
