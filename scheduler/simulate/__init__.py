"""`carbonsched simulate`: replay job and carbon traces through the daemon's own policies.

Modules, in the order data flows through them:

- `cluster`: the simulated cluster from a TOML file (nodes, zones, GPUs, PUE, prices, caps).
- `traces`: job trace adapters (GAIA, Alibaba GPU v2023, LLM request logs, generic CSV).
- `intensity`: actual carbon intensity per zone (hourly, fast integrals).
- `forecasts`: what the simulated planner believes (perfect, noisy, persistence, model).
- `scenario`: the jobs on the carbon data's calendar, with deadlines; the bundled demo.
- `model`: the SimPy model (`Simulation`: arrivals, planner ticks, failures) over the
  state its parts share (`state`: clock, jobs, queue, counters; `settings`: `SimSettings`),
  composed of `gpus` (health, reservations, the planner's view of the GPUs), `power`
  (meters per zone and site budget, caps over the horizon, ramps), `knowledge` (profiles
  and estimate corrections, learned as jobs finish), `planning` (the ticks and the
  oracle's one look), `dispatch` (commits, the truth) and `execution` (starts, segments,
  ends, evictions); `records` holds what a run records (`JobRecord`, `ZoneMeter`,
  `TickStat`, `PolicyRun`).
- `truth`, `estimates`: how jobs really run, and what the planner is told of their lengths.
- `runner`: several policies over one scenario; `metrics` and `report` turn runs into
  numbers, tables, JSON, CSV and plots; `shadow` replays the production store's history.
"""
