"""Does learning on one GPU model help predict the others? (policies.model.learning)

A synthetic cluster: for every (workload, GPU model) with a seed profile, a hidden truth =
seed x exp(w + e) in throughput and in power, w a per-workload error shared by all models
(N(0, --sigma-workload)), e a per-model error (N(0, --sigma-model)). Jobs of each workload
arrive on GPU models in random order; each run measures the truth x per-run noise
(N(0, --sigma-run)), and a share of runs (--outliers) are stalls 10x slower. Before each run
the job's energy per prompt is predicted from the learned profiles (a) with each model
learning alone and (b) with the workload's correction from other models shared; the table
gives the median and p90 absolute error of that prediction by how many runs of the workload
the GPU model had seen before.

    python -m bench.learning_bench [--trials 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import defaultdict

from policies.model.energy import ProfileBook, seed_profiles
from policies.model.learning import Run, estimate, shared_ratios


def trial(rng: random.Random, book: dict, args) -> dict[tuple[str, int], list[float]]:
    errors: dict[tuple[str, int], list[float]] = defaultdict(list)
    workloads = sorted({w for w, _ in book})
    for w in workloads:
        models = sorted(m for ww, m in book if ww == w)
        shared_err = (rng.gauss(0, args.sigma_workload), rng.gauss(0, args.sigma_workload))
        truth = {}
        for m in models:
            seed = book[w, m]
            e = (rng.gauss(0, args.sigma_model), rng.gauss(0, args.sigma_model))
            truth[m] = (seed.prompts_per_s * math.exp(shared_err[0] + e[0]), seed.power_w * math.exp(shared_err[1] + e[1]))
        runs: dict[str, list[Run]] = {m: [] for m in models}
        order = [m for m in models for _ in range(args.runs)]
        rng.shuffle(order)
        for m in order:
            seed = book[w, m]
            true_j = truth[m][1] / truth[m][0]  # J per prompt
            for mode in ("alone", "shared"):
                shared = None
                if mode == "shared":
                    shared = shared_ratios((book[w, o], runs[o]) for o in models if o != m)
                p = estimate(seed, runs[m], workload=w, model=m, shared=shared) if (runs[m] or shared) else seed
                errors[mode, len(runs[m])].append(abs(p.power_w / p.prompts_per_s / true_j - 1))
            slow = 10.0 if rng.random() < args.outliers else 1.0
            noise = math.exp(rng.gauss(0, args.sigma_run))
            runs[m].append(Run(truth[m][0] * noise / slow, truth[m][1] * math.exp(rng.gauss(0, args.sigma_run / 2))))
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--runs", type=int, default=6, help="runs per (workload, model) in a trial")
    p.add_argument("--sigma-workload", type=float, default=0.3)
    p.add_argument("--sigma-model", type=float, default=0.1)
    p.add_argument("--sigma-run", type=float, default=0.05)
    p.add_argument("--outliers", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    book = {(s.workload, s.model): s for s in seed_profiles()}
    ProfileBook(tuple(book.values()))  # the same seeds the planner uses
    rng = random.Random(args.seed)
    errors: dict[tuple[str, int], list[float]] = defaultdict(list)
    for _ in range(args.trials):
        for k, v in trial(rng, book, args).items():
            errors[k].extend(v)
    print(f"J/prompt prediction error before a run, by runs already seen on that GPU model "
          f"({args.trials} trials; sigma workload {args.sigma_workload}, model {args.sigma_model}, "
          f"run {args.sigma_run}; {args.outliers:.0%} 10x stalls)")
    print(f"{'runs seen':>9}  {'alone: median':>13}  {'p90':>6}  {'shared: median':>14}  {'p90':>6}")
    for n in range(args.runs):
        a, s = sorted(errors["alone", n]), sorted(errors["shared", n])
        q = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]
        print(f"{n:>9}  {statistics.median(a):>13.1%}  {q(a, 0.9):>6.1%}  {statistics.median(s):>14.1%}  {q(s, 0.9):>6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
