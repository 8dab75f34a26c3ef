#!/usr/bin/env python3
"""A small CPU job that checkpoints and resumes, for `carbonsched submit --interruptible`.

It runs `--steps` steps of a hash chain (each step a SHA-256 of the previous digest and the
step number, plus `--step-s` of sleep to stand in for real work) and writes the final
digest to `--out`. The digest depends on every step done exactly once in order, so a run
cut into segments gives the same output as an uninterrupted one only if its state really
was saved and restored.

As carbonsched runs it:

- its state (the next step and the digest) lives in `$CARBONSCHED_CHECKPOINT_DIR/state.json`,
  written atomically (a temporary file, then rename); at start it restores it if there;
- asked to checkpoint, by its checkpoint signal (SIGUSR1 unless `--signal` says otherwise:
  give the same as `submit --checkpoint-signal`) or by the file `$CARBONSCHED_CHECKPOINT_FILE`
  appearing, it finishes its step, saves its state and exits 75 ("checkpointed, resume me");
- every `--checkpoint-every` steps it saves its state anyway, so a run that is killed loses
  at most that many steps;
- after each step it reports its running total in `$CARBONSCHED_METRICS_FILE` as
  `prompts=N` (submit it with `--prompts STEPS`: carbonsched then counts the share done from
  it), and with `--trace FILE` it appends each step it ran and when
  (`STEP EPOCH_S`), to count work done twice and see pauses.

Without carbonsched (no checkpoint directory) it simply runs all its steps. `--ignore`
makes it ignore checkpoint requests (to test a job that does not co-operate).

    carbonsched submit --interruptible checkpoint --est-runtime 2h --min-run 20m --prompts 7200 -- \\
        python3 examples/jobs/checkpoint_job.py --steps 7200 --step-s 1 --out result.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time

CHECKPOINTED = 75  # EX_TEMPFAIL: checkpointed, resume me


def load(state_path: str | None) -> tuple[int, str]:
    """The next step and the digest so far: restored from the checkpoint, or the start."""
    if state_path and os.path.exists(state_path):
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        return int(state["step"]), str(state["digest"])
    return 0, hashlib.sha256(b"carbonsched").hexdigest()


def save(state_path: str, step: int, digest: str) -> None:
    """Write the checkpoint atomically: a crash mid-write leaves the previous one."""
    tmp = state_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"step": step, "digest": digest}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--out", required=True)
    p.add_argument("--signal", default="SIGUSR1")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--trace")
    p.add_argument("--ignore", action="store_true", help="ignore checkpoint requests")
    args = p.parse_args()

    ckdir = os.environ.get("CARBONSCHED_CHECKPOINT_DIR")
    state_path = os.path.join(ckdir, "state.json") if ckdir else None
    request_file = os.environ.get("CARBONSCHED_CHECKPOINT_FILE")
    metrics = os.environ.get("CARBONSCHED_METRICS_FILE")
    asked = False

    def on_signal(signum, frame):
        nonlocal asked
        asked = True

    signame = args.signal.upper() if args.signal.upper().startswith("SIG") else "SIG" + args.signal.upper()
    signal.signal(getattr(signal, signame), signal.SIG_IGN if args.ignore else on_signal)

    step, digest = load(state_path)
    print(f"attempt {os.environ.get('CARBONSCHED_RESUME_COUNT', '0')}: starting at step {step}", flush=True)
    while step < args.steps:
        if not args.ignore and (asked or (request_file and os.path.exists(request_file))):
            if state_path:
                save(state_path, step, digest)
                print(f"checkpointed at step {step}", flush=True)
                return CHECKPOINTED
        time.sleep(args.step_s)
        digest = hashlib.sha256(f"{digest}:{step}".encode()).hexdigest()
        step += 1
        if args.trace:
            with open(args.trace, "a", encoding="utf-8") as f:
                f.write(f"{step} {time.time():.3f}\n")
        if metrics:
            with open(metrics, "a", encoding="utf-8") as f:
                f.write(f"prompts={step}\n")
        if state_path and args.checkpoint_every and step % args.checkpoint_every == 0:
            save(state_path, step, digest)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(f"{args.steps} {digest}\n")
    print(f"done: {args.steps} steps, {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
