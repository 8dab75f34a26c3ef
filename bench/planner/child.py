"""One timed planning run in a fresh process: `python -m bench.planner.child IN OUT POLICY [PARAMS]`.

The parent pickles the Snapshot to IN; this process imports the policies and derives the
seed profiles (the performance model's fit, which a daemon's planner process does once at
start, 0.3 s), notes its peak RSS (the baseline), loads the snapshot, times `policy.plan(snapshot)` (wall and CPU), and
writes {"plan": Plan, "figures": {...}} to OUT as a pickle. A fresh process per run makes
the peak resident set (`VmHWM`, see `_rss_mb`) that run's own, not the benchmark's.
"""

from __future__ import annotations

import json
import pickle
import resource
import sys
import time


def _rss_mb() -> float:
    """Peak resident set of this process so far, in MB.

    Linux's `VmHWM` (the high-water mark of this program's memory) rather than
    `getrusage().ru_maxrss`: the kernel carries ru_maxrss over from the parent across
    fork + exec, so a child of a large benchmark process would report the parent's size.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str]) -> int:
    in_path, out_path, name = argv[:3]
    params = json.loads(argv[3]) if len(argv) > 3 else {}
    import numpy  # noqa: F401  (imports before the baseline, as a long-lived planner has them)
    import policies.solvers.cpsat  # noqa: F401
    import policies.solvers.fifo  # noqa: F401
    import policies.solvers.greedy  # noqa: F401
    import policies.problem.instance  # noqa: F401
    from policies.base import get_policy
    from policies.model.energy import seed_profiles

    seed_profiles()  # the performance model's fit and seed points: the daemon's planner process makes them at start
    baseline_mb = _rss_mb()
    with open(in_path, "rb") as f:
        snapshot = pickle.load(f)
    loaded_mb = _rss_mb()
    policy = get_policy(name, **params)
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    plan = policy.plan(snapshot)
    wall_s = time.perf_counter() - t0
    cpu_s = _cpu_s() - cpu0
    peak_mb = _rss_mb()
    figures = {"wall_s": wall_s, "cpu_s": cpu_s, "peak_rss_mb": peak_mb, "baseline_rss_mb": baseline_mb,
               "loaded_rss_mb": loaded_mb, "peak_over_baseline_mb": peak_mb - baseline_mb}
    with open(out_path, "wb") as f:
        pickle.dump({"plan": plan, "figures": figures}, f, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
