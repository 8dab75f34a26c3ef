"""Does the daemon learn a truth it cannot see? A convergence run on the emulated fleet.

    .venv/bin/python bench/convergence_bench.py [--runs 5] [--seconds 2.5] [--db URL] [--json OUT]

A real `carbonsched daemon` (SQLite by default, its in-process agent) runs an emulated fleet
of one H100 and one MI300X with a hidden truth (`--truth profiles:FILE`, see
`scheduler.node.emulation`) that differs from the seed profile the planner starts from:
`llm-chat-8b` runs 40 % longer on the H100 (throughput / 1.4) and draws 30 % less power on the
MI300X. The seed figures are read from `policies.model.energy.seed_profiles()`, the planner's own
(whatever they are when this runs). Then, alternately on each GPU model (the other one
drained), `--runs` batches of `examples/jobs/tiny_batch.py` are submitted one after the
other, each sized to take about `--seconds` by the seed; the job paces itself by what the
agent tells it (`CARBONSCHED_EMULATED_S_PER_PROMPT`). Each run's predicted energy is the
plan's estimate (`est_energy_j`, made from what was learned before it); its measured energy
is the agent's (`energy_j`, the emulator's integral of the truth's power over the job's real
wall time). The table gives the error run by run; the target: within 10 % after
at most 5 runs on each model.

It reuses the test suite's daemon harness (`tests/daemon_harness.py`);
`tests/e2e/test_convergence.py` runs it short and asserts the target.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from policies.model.energy import seed_profiles  # noqa: E402

WORKLOAD = "llm-chat-8b"
SLOW = "H100"  # +40 % runtime
FRUGAL = "MI300X"  # -30 % power
RUNTIME_FACTOR = 1.4
POWER_FACTOR = 0.7
NODE = "conv"
TARGET_REL_ERROR = 0.10


@dataclass(frozen=True)
class RunRow:
    """One run of the workload: where, the plan's energy estimate, the measured energy."""

    model: str
    run: int
    job: int
    prompts: int
    predicted_j: float
    measured_j: float

    @property
    def rel_error(self) -> float:
        return (self.predicted_j - self.measured_j) / self.measured_j


def seed_of(model: str):
    for p in seed_profiles():
        if p.workload == WORKLOAD and p.model == model:
            return p
    raise SystemExit(f"no seed profile for {WORKLOAD} on {model}")


def write_truth(path: Path) -> None:
    """The hidden truth: the seeds of both models, one slower and one more frugal."""
    slow, frugal = seed_of(SLOW), seed_of(FRUGAL)
    rows = [(slow, slow.prompts_per_s / RUNTIME_FACTOR, slow.power_w),
            (frugal, frugal.prompts_per_s, frugal.power_w * POWER_FACTOR)]
    path.write_text("".join(
        f'[[profile]]\nworkload = "{p.workload}"\nmodel = "{p.model}"\nprompts_per_s = {pps!r}\n'
        f"power_w = {w!r}\n\n" for p, pps, w in rows))


def converge(db_url: str, *, runs: int = 5, seconds: float = 2.5, root: Path | None = None) -> list[RunRow]:
    """Start the daemon, run the workload `runs` times on each model, return the rows."""
    from daemon_harness import DaemonProcess, world_dir

    root = root or world_dir("cs-converge-")
    truth = root / "truth.toml"
    write_truth(truth)
    d = DaemonProcess(root, db_url, emulate=f"1x{SLOW},1x{FRUGAL}",
                      extra=["--truth", f"profiles:{truth}", "--node", NODE, "--policy", "greedy"])
    d.start()
    try:
        client = d.client()
        gpus = {g["model"]: g["uuid"] for n in client.request("GET", "/nodes") for g in n["gpus"]}
        rows: list[RunRow] = []
        for i in range(1, runs + 1):
            for model, other in ((SLOW, FRUGAL), (FRUGAL, SLOW)):
                client.request("POST", "/drain", {"target": gpus[other]})
                client.request("POST", "/resume", {"target": gpus[model]})
                prompts = max(1, round(seconds * seed_of(model).prompts_per_s))
                job = client.submit(argv=[sys.executable, str(ROOT / "examples/jobs/tiny_batch.py"),
                                          "--prompts", str(prompts), "--batches", "2"],
                                    name=f"conv-{model}-{i}", workload=WORKLOAD, prompts=prompts,
                                    cwd=str(root))["id"]
                j = d.wait_states([job], timeout_s=120)[job]
                if j["state"] != "COMPLETED" or not j["energy_j"] or not j["est_energy_j"]:
                    raise RuntimeError(f"run {i} on {model}: job {job} ended {j['state']} "
                                       f"(energy {j['energy_j']}, estimate {j['est_energy_j']})\n{d.log()}")
                if j["node"] != NODE or model not in (j.get("explanation") or ""):
                    raise RuntimeError(f"job {job} did not run on the {model}: {j.get('explanation')}")
                rows.append(RunRow(model, i, job, prompts, float(j["est_energy_j"]),
                                   float(j["energy_j"])))
        return rows
    finally:
        d.cleanup()


def first_within(rows: list[RunRow], model: str, target: float = TARGET_REL_ERROR) -> int | None:
    """The run from which every prediction on `model` is within `target` of the measurement."""
    mine = [r for r in rows if r.model == model]
    for k, r in enumerate(mine):
        if all(abs(x.rel_error) <= target for x in mine[k:]):
            return r.run
    return None


def table(rows: list[RunRow]) -> str:
    lines = [f"truth: {WORKLOAD} on {SLOW} runs x{RUNTIME_FACTOR} longer, on {FRUGAL} draws x{POWER_FACTOR} "
             "the power of the seed profile",
             "| model | run | job | prompts | predicted kJ | measured kJ | error |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r.model, r.run)):
        lines.append(f"| {r.model} | {r.run} | {r.job} | {r.prompts} | "
                     f"{r.predicted_j / 1e3:.2f} | {r.measured_j / 1e3:.2f} | {100 * r.rel_error:+.1f} % |")
    for model in (SLOW, FRUGAL):
        k = first_within(rows, model)
        lines.append(f"{model}: within {100 * TARGET_REL_ERROR:.0f} % from run {k}" if k
                     else f"{model}: NOT within {100 * TARGET_REL_ERROR:.0f} % by the last run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs per GPU model (default 5)")
    p.add_argument("--seconds", type=float, default=2.5, help="each run's length by the seed (default 2.5)")
    p.add_argument("--db", help="database URL (default: SQLite in a temporary state directory)")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    from daemon_harness import world_dir

    root = world_dir("cs-converge-")
    db = args.db or f"sqlite:///{root}/state/carbonsched.db"
    rows = converge(db, runs=args.runs, seconds=args.seconds, root=root)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) | {"rel_error": r.rel_error} for r in rows], indent=2))
    ok = all(first_within(rows, m) is not None and first_within(rows, m) <= 5 for m in (SLOW, FRUGAL))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
