#!/usr/bin/env python3
"""The README's first command: carbonsched end to end on one machine.

Starts the daemon on the embedded default (SQLite under .demo/) with an emulated fleet,
submits a handful of jobs as a user would, shows the queue while they run, cancels one,
waits for the rest and prints the results. Every step prints the CLI command it runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / ".demo"
SOCKET = DEMO / "carbonsched.sock"
FLEET = "2xMI300X,2xH100"


def cs(*args: str, quiet: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "scheduler", *args]
    if not quiet:
        print(f"\n$ carbonsched {' '.join(args)}", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CARBONSCHED_SOCKET": str(SOCKET)})
    if not quiet:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
    return r


def main() -> int:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    print(f"starting carbonsched daemon: SQLite in {DEMO}, emulated fleet {FLEET} "
          f"(log: {DEMO / 'daemon.log'})")
    log = open(DEMO / "daemon.log", "w")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "daemon", "--state-dir", str(DEMO), "--socket", str(SOCKET),
         "--emulate", FLEET, "--truth", "perfect", "--zone", "DE", "--plan-interval", "2s", "--dispatch-interval", "0.2s"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            if cs("queue", quiet=True).returncode == 0:
                break
            if daemon.poll() is not None:
                print((DEMO / "daemon.log").read_text())
                return 1
            time.sleep(0.1)
        else:
            print("daemon did not come up; see", DEMO / "daemon.log")
            return 1
        ids = []
        jobs = [
            ["--name", "llama-eval", "--workload", "eval", "--gpus", "1", "--gpu-mem", "60",
             "--est-runtime", "3s", "--deadline", "2h", "--", "sh", "-c",
             "echo evaluating on GPUs $CUDA_VISIBLE_DEVICES$ROCR_VISIBLE_DEVICES; sleep 2; echo accuracy=0.71"],
            ["--name", "big-finetune", "--workload", "finetune", "--gpus", "2", "--gpu-mem", "150",
             "--est-runtime", "4s", "--", "sh", "-c", "echo fine-tuning on ROCR_VISIBLE_DEVICES=$ROCR_VISIBLE_DEVICES; sleep 3"],
            ["--name", "batch-infer", "--workload", "llm-inference", "--prompts", "50", "--gpus", "1",
             "--", "python3", str(REPO / "examples" / "jobs" / "tiny_batch.py"), "--prompts", "50"],
            ["--name", "broken-job", "--est-runtime", "2s", "--", "sh", "-c", "echo oops >&2; exit 3"],
            ["--name", "runaway", "--time-limit", "2s", "--", "sleep", "600"],
            ["--name", "to-cancel", "--gpus", "2", "--est-runtime", "30s", "--", "sleep", "30"],
        ]
        for args in jobs:
            r = cs("submit", "--json", *args)
            if r.returncode != 0:
                return 1
            ids.append(int(r.stdout.split(":")[1].strip(" }\n")))
        time.sleep(1.0)
        cs("queue")
        cs("nodes")
        cs("cancel", str(ids[-1]))
        print("\nwaiting for the jobs to finish ...", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = cs("queue", "--json", quiet=True)
            if r.stdout.strip() in ("[]", ""):
                break
            time.sleep(0.5)
        cs("queue", "--all")
        cs("show", str(ids[0]))
        cs("logs", str(ids[0]))
        cs("logs", str(ids[3]), "--stderr")
        print("\n$ carbonsched submit --gpus 64 -- true    # bad input: a clear error, nothing queued")
        r = cs("submit", "--gpus", "64", "--", "true", quiet=True)
        print(r.stderr.strip(), f"(exit code {r.returncode})")
        print("\n# carbon accounting: a job that must start now, its carbon receipt, and the fleet report")
        # the job reports what it served in $CARBONSCHED_METRICS_FILE (examples/jobs/tiny_batch.py)
        # (on this fleet run by the model's own figures, --truth perfect, it takes as long as 100
        # prompts would on its GPU; reporting 97 of them, it shows that reported counts win)
        r = cs("submit", "--json", "--name", "receipt-demo", "--workload", "llm-inference", "--prompts", "100",
               "--gpus", "1", "--max-delay", "1s", "--", "python3",
               str(REPO / "examples" / "jobs" / "tiny_batch.py"), "--prompts", "97")
        if r.returncode != 0:
            return 1
        job = int(r.stdout.split(":")[1].strip(" }\n"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and '"ended_at": null' in cs("show", str(job), "--json", quiet=True).stdout:
            time.sleep(0.5)
        cs("show", str(job))
        cs("report", "--by", "workload", "--since", "1h")
        print(f"\ndemo done. The daemon's log is {DEMO / 'daemon.log'}.")
        return 0
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
