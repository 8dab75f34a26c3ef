"""An idealised per-job replay of GAIA's setting: how a job of unknown length is best placed.

    .venv/bin/python bench/estimate_replay.py [--zones DE,US-CAL-CISO] [--points 20]

pai_1k on the 2022 Electricity Maps data of each zone from 2022-10-19 16:00 UTC, as the
`simulate_bench.py gaia` scenario. Each job alone (no queue, no capacity limit) picks one of
the 97 quarter-hour starts of its 24 h maximum wait and then runs its real length; what it is
told of that length decides the start:

- `exact`: its real length (the best one start can do);
- `class mean`: the mean length of its GAIA queue (under / over 2 h), GAIA's knowledge;
- `class median`: the queue's median (what a median-ratio correction plans with);
- `expected`: the mean grams over the queue's lengths (`--points` quantiles), the rule of
  `policies.model.length_spread`.

Printed: the reduction of each rule's grams against running every job at its arrival (every
job drawing the same power per GPU). Not a simulation: no re-planning, no learning from
finished jobs (the queue's distribution is the whole trace's), so it shows what each rule can
reach, not what the planner reaches (`simulate_bench.py gaia --estimate class-mean`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

QUARTER_S = 900.0
WAIT_S = 24 * 3600.0


def replay(zone: str, points: int) -> dict[str, float]:
    """Each rule's reduction (%) against run-at-arrival in one zone."""
    from simulate_bench import GAIA_START, PAI_1K, _carbon
    from scheduler.simulate.cluster import load_cluster
    from scheduler.simulate.estimates import class_means, gaia_queue
    from scheduler.simulate.scenario import build_scenario
    from scheduler.simulate.traces import read_jobs

    cluster = {"DE": "cluster-gaia-de.toml", "US-CAL-CISO": "cluster-gaia-caiso.toml"}[zone]
    carbon = _carbon([zone])
    intensity = carbon[zone]
    scenario = build_scenario(load_cluster(ROOT / "examples" / cluster), read_jobs(PAI_1K), carbon,
                              start=GAIA_START, slack_s=None, max_wait_s=WAIT_S)
    lengths = [float(j.est_runtime_s) for j in scenario.jobs]
    means = class_means(lengths)
    by_queue: dict[str, list[float]] = {}
    for r in lengths:
        by_queue.setdefault(gaia_queue(r), []).append(r)
    medians = {q: float(np.median(v)) for q, v in by_queue.items()}
    levels = (np.arange(points) + 0.5) / points
    quantiles = {q: np.quantile(v, levels) for q, v in by_queue.items()}

    def grams(start: float, length: float) -> float:
        return intensity.integral_g_per_kwh_s(start, start + length)

    totals = dict.fromkeys(("at arrival", "exact", "class mean", "class median", "expected"), 0.0)
    for job, real in zip(scenario.jobs, lengths):
        arrival, k, queue = job.submitted_at.timestamp(), max(1, job.gpus), gaia_queue(real)
        starts = arrival + QUARTER_S * np.arange(int(WAIT_S // QUARTER_S) + 1)

        def placed(told: float) -> float:
            return min(starts, key=lambda s: grams(s, told))

        totals["at arrival"] += k * grams(arrival, real)
        for rule, told in (("exact", real), ("class mean", means[queue]), ("class median", medians[queue])):
            totals[rule] += k * grams(placed(told), real)
        best = min(starts, key=lambda s: sum(grams(s, q) for q in quantiles[queue]))
        totals["expected"] += k * grams(best, real)
    base = totals.pop("at arrival")
    return {rule: 100.0 * (1.0 - g / base) for rule, g in totals.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zones", default="DE,US-CAL-CISO")
    p.add_argument("--points", type=int, default=20, help="quantiles of a queue's lengths for `expected`")
    args = p.parse_args()
    for zone in args.zones.split(","):
        figures = replay(zone, args.points)
        print(f"{zone}: " + ", ".join(f"{rule} {pct:.2f} %" for rule, pct in figures.items()), flush=True)


if __name__ == "__main__":
    main()
