#!/usr/bin/env python3
"""carbonsched API benchmark: submission throughput/latency and `queue --json` with 10k jobs.

For each database (SQLite, PostgreSQL or both) it starts a real daemon subprocess on a fresh
store, then measures over the real Unix socket:

1. submissions: C client processes (default 16), each with one kept-alive
   `scheduler.cli.client.Client`, submit N jobs in total (default 3000) as fast as they can;
   every request's latency is recorded. Four long "blocker" jobs are submitted and running
   first, so the emulated GPUs are busy and the measured `true` jobs queue behind them
   (the daemon keeps planning on every submit, as in production, but does not churn
   through thousands of tiny jobs; `--let-run` drops the blockers to measure that too).
2. listing: the store is topped up to 10,000 active jobs (rows inserted directly with
   SQLAlchemy Core, shaped by the service's own submit validation), the planner is left to
   settle, then `GET /v1/jobs` through `Client` and the whole CLI process
   `carbonsched queue --json` are timed (median of 5 each); the CLI output must parse as
   JSON with exactly 10,000 entries.

Run: `make bench`, or `.venv/bin/python bench/api_bench.py [--db sqlite|postgres|both]
[--json FILE]`. See bench/README.md. This is a script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET_SUBMITS_PER_S = 300.0
TARGET_P99_MS = 50.0
TARGET_QUEUE_S = 0.5

DEFAULT_PG_ADMIN_URL = os.environ.get("CARBONSCHED_TEST_PG_URL",
                                      "postgresql+psycopg://postgres@127.0.0.1:5432/test")
EMULATED_FLEET = "4xH100"
N_GPUS = 4
BLOCKER_SLEEP_S = 900  # blockers end by themselves even if every clean-up step failed
JOB_EST_RUNTIME_S = 3600.0
BLOCKER_EST_RUNTIME_S = 86400.0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds a process has used (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def submit_body(argv: list[str], est_runtime_s: float) -> dict:
    """What `carbonsched submit --gpus 1 --est-runtime ... -- argv` sends."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
    return {"argv": argv, "gpus": 1, "gpu_mem_gib": 0.0, "cwd": "/", "max_retries": 0,
            "est_runtime_s": est_runtime_s, "env": env}


# -- client worker processes --------------------------------------------------------------

def _submit_worker(index: int, socket_path: str, n: int, body: dict, barrier, counter,
                   out_q, rate: float | None = None) -> None:
    """One client: connect, wait for the start signal, submit n jobs, report latencies.

    With `rate` (submits/s for this client) requests follow a fixed schedule (open loop) and
    each latency counts from the request's scheduled time, so a stalled daemon shows up in
    the figures instead of silently slowing the clients down (no coordinated omission)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the parent's handler came along with fork)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    from scheduler.cli.client import ApiError, Client, DaemonUnreachable

    client = Client(socket_path, timeout=120.0)
    latencies: list[float] = []
    sent_at: list[float] = []
    errors = ok = 0
    samples: list[str] = []
    start = end = 0.0
    try:
        client.request("GET", "/health")  # open the kept-alive connection before the clock
        barrier.wait(timeout=120)
        start = time.perf_counter()
        pending = 0
        for i in range(n):
            t0 = time.perf_counter()
            if rate:
                scheduled = start + i / rate
                if scheduled > t0:
                    time.sleep(scheduled - t0)
                t0 = scheduled
            try:
                client.submit(**body)
                ok += 1
            except (ApiError, DaemonUnreachable, OSError) as e:
                errors += 1
                if len(samples) < 3:
                    samples.append(f"{type(e).__name__}: {e}")
                if isinstance(e, DaemonUnreachable) and errors > 20:
                    break
            latencies.append((time.perf_counter() - t0) * 1000.0)
            sent_at.append(t0)
            pending += 1
            if pending == 10:
                with counter.get_lock():
                    counter.value += pending
                pending = 0
        end = time.perf_counter()
        with counter.get_lock():
            counter.value += pending
    except Exception as e:  # report, never hang the parent
        if not start:
            barrier.abort()  # the parent is waiting for every client to connect
        samples.append(f"worker {index} aborted: {type(e).__name__}: {e}")
        errors += 1
        end = end or time.perf_counter()
    finally:
        client.close()
    out_q.put({"index": index, "start": start, "end": end, "latencies_ms": latencies, "sent_at": sent_at,
               "ok": ok, "errors": errors, "error_samples": samples})


# -- one daemon on one database -----------------------------------------------------------

class Bench:
    """Everything for one database: temp dir, optional PG database, daemon, clean-up."""

    def __init__(self, kind: str, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.kind = kind
        self.args = args
        self.stack = stack
        self.tmp = Path(tempfile.mkdtemp(prefix=f"carbonsched-bench-{kind}-"))
        stack.callback(self._remove_tmp)
        self.socket = self.tmp / "s.sock"
        self.daemon: subprocess.Popen | None = None
        self.daemon_log = self.tmp / "daemon.log"
        self.db_url = self._make_db()
        self._profiler: subprocess.Popen | None = None

    # database --------------------------------------------------------------------------

    def _make_db(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp / 'carbonsched.db'}"
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        name = f"cs_bench_{uuid.uuid4().hex[:12]}"
        admin = create_engine(self.args.pg_url, isolation_level="AUTOCOMMIT",
                              connect_args={"connect_timeout": 5})
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))

        def drop() -> None:
            say(f"{self.kind}: dropping database {name}")
            try:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            finally:
                admin.dispose()

        self.stack.callback(drop)
        say(f"{self.kind}: created database {name}")
        return make_url(self.args.pg_url).set(database=name).render_as_string(hide_password=False)

    def _remove_tmp(self) -> None:
        if self.args.keep:
            say(f"{self.kind}: kept state dir {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # daemon ----------------------------------------------------------------------------

    def start_daemon(self) -> None:
        cmd = [sys.executable, "-m", "scheduler", "daemon", "--state-dir", str(self.tmp),
               "--socket", str(self.socket), "--db", self.db_url, "--emulate", EMULATED_FLEET,
               "--plan-interval", "15s", "--local-agent", "--log-level", self.args.log_level,
               # one uid stands in for a cluster's many users here: the per-user limits
               # (issue 25) would refuse the bench's own load
               "--max-queued-per-user", "10000000", "--api-max-expensive-per-uid", "1000"]
        if self.args.planner_thread:
            cmd.append("--no-planner-process")
        log = open(self.daemon_log, "wb")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
        # A session of its own: a Ctrl-C at the terminal reaches only us, and we stop it.
        self.daemon = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       cwd=str(ROOT), env=env, start_new_session=True)
        log.close()
        self.stack.callback(self._kill_leftover_supervisors)
        self.stack.callback(self.stop_daemon)
        say(f"{self.kind}: daemon pid {self.daemon.pid} starting (log {self.daemon_log})")
        self._wait_healthy(timeout_s=90.0)

    def _wait_healthy(self, timeout_s: float) -> None:
        from scheduler.cli.client import ApiError, Client, DaemonUnreachable

        deadline = time.monotonic() + timeout_s
        t0 = time.monotonic()
        while True:
            if self.daemon.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.daemon.returncode} before answering:\n"
                                   + self.log_tail())
            c = Client(self.socket, timeout=5.0)
            try:
                if c.request("GET", "/health").get("ok"):
                    say(f"{self.kind}: daemon healthy after {time.monotonic() - t0:.1f}s")
                    return
            except (DaemonUnreachable, ApiError, OSError):
                pass
            finally:
                c.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not answer GET /v1/health in {timeout_s:.0f}s:\n"
                                   + self.log_tail())
            time.sleep(0.1)

    def stop_daemon(self) -> dict | None:
        """SIGTERM, then SIGKILL after a grace period; says how long it took and how."""
        p = self.daemon
        if p is None or p.poll() is not None:
            return None
        say(f"{self.kind}: stopping daemon pid {p.pid} (SIGTERM)")
        t0 = time.perf_counter()
        p.terminate()
        try:
            p.wait(timeout=self.args.stop_grace)
            return {"stop_s": round(time.perf_counter() - t0, 2), "killed": False,
                    "exit_code": p.returncode}
        except subprocess.TimeoutExpired:
            say(f"{self.kind}: daemon did not stop {self.args.stop_grace:.0f}s after SIGTERM; killing it")
            p.kill()
            p.wait(timeout=10)
            return {"stop_s": round(time.perf_counter() - t0, 2), "killed": True, "exit_code": p.returncode}

    def _kill_leftover_supervisors(self) -> None:
        """Job supervisors outlive the daemon by design; end the ones this run started."""
        from scheduler.node.executor import _lock_held

        run_root = self.tmp / "run"
        alive: list[tuple[int, int | None, Path]] = []
        for d in sorted(run_root.glob("*")) if run_root.is_dir() else []:
            try:
                launched = json.loads((d / "launched.json").read_text())
            except (OSError, ValueError):
                continue
            if not _lock_held(d / "lock"):
                continue
            pgid = None
            with contextlib.suppress(OSError, ValueError, KeyError):
                pgid = int(json.loads((d / "pid.json").read_text())["pgid"])
            alive.append((int(launched["supervisor_pid"]), pgid, d))
        if not alive:
            return
        say(f"{self.kind}: stopping {len(alive)} job supervisor(s) left running")
        for pid, _, _ in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)  # the supervisor stops its job's group
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_lock_held(d / "lock") for _, _, d in alive):
            time.sleep(0.1)
        for pid, pgid, d in alive:
            if _lock_held(d / "lock"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if pgid:
                        os.killpg(pgid, signal.SIGKILL)
                    os.kill(pid, signal.SIGKILL)

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.daemon_log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no daemon log)"
        return "\n".join("    " + line for line in lines[-n:])

    # profiling (optional) ----------------------------------------------------------------

    def profile_start(self, phase: str) -> None:
        if not self.args.profile:
            return
        out = Path(self.args.profile) / f"{self.kind}-{phase}.{self.args.profile_format_ext}"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [self.args.py_spy, "record", "-p", str(self.daemon.pid), "-o", str(out),
               "--format", self.args.profile_format, "-r", "200", "--nonblocking"]
        self._profiler = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, start_new_session=True)
        self.stack.callback(self.profile_stop)
        time.sleep(0.5)  # let py-spy attach
        say(f"{self.kind}: py-spy recording the daemon -> {out}")

    def profile_stop(self) -> None:
        p, self._profiler = self._profiler, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            return
        if p.returncode not in (0, None) and err:
            say(f"{self.kind}: py-spy: {err.decode(errors='replace').strip()[-300:]}")

    # helpers ---------------------------------------------------------------------------

    def client(self):
        from scheduler.cli.client import Client

        return Client(self.socket, timeout=120.0)

    def counts(self) -> dict[str, int]:
        c = self.client()
        try:
            return c.request("GET", "/health")["jobs"]
        finally:
            c.close()

    def wait_for(self, what: str, cond, timeout_s: float, stable_polls: int = 1) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        last, same = None, 0
        while True:
            counts = self.counts()
            if cond(counts):
                same = same + 1 if counts == last else 1
                if same >= stable_polls:
                    return counts
            else:
                same = 0
            last = counts
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind}: timed out after {timeout_s:.0f}s waiting for {what}; "
                                   f"job counts {counts}\n{self.log_tail()}")
            if self.daemon.poll() is not None:
                raise RuntimeError(f"{self.kind}: daemon died:\n{self.log_tail()}")
            time.sleep(0.5)

    # phase 0: blockers -----------------------------------------------------------------

    def submit_blockers(self) -> None:
        """Occupy every emulated GPU with a long job so the measured jobs queue behind."""
        c = self.client()
        try:
            for _ in range(N_GPUS):
                c.submit(**submit_body(["sleep", str(BLOCKER_SLEEP_S)], BLOCKER_EST_RUNTIME_S),
                         name="bench-blocker")
        finally:
            c.close()
        self.wait_for(f"{N_GPUS} blocker jobs RUNNING", lambda k: k.get("RUNNING", 0) >= N_GPUS, 60.0)
        say(f"{self.kind}: {N_GPUS} blocker jobs running on the emulated {EMULATED_FLEET}")

    def cancel_active(self) -> None:
        from scheduler.cli.client import ApiError

        c = self.client()
        try:
            ids = [j["id"] for j in c.jobs()]
            say(f"{self.kind}: cancelling {len(ids)} active jobs")
            for i in range(0, len(ids), 500):
                batch = ids[i:i + 500]
                try:
                    c.cancel(batch)
                except ApiError as e:
                    if e.status != 409:
                        raise
                    for j in batch:  # one of them ended meanwhile: one by one
                        with contextlib.suppress(ApiError):
                            c.cancel([j])
        finally:
            c.close()
        self.wait_for("no active jobs", lambda k: not any(k.get(s, 0) for s in ("PENDING", "PLANNED", "RUNNING")),
                      120.0)

    # phase 1: submissions --------------------------------------------------------------

    def bench_submit(self, rate: float | None = None) -> dict:
        """Submit a.jobs jobs from a.clients processes: as fast as they can (rate None), or at
        a fixed total offered rate to measure latency at that load."""
        a = self.args
        total, n_clients = a.jobs, a.clients
        shares = [total // n_clients + (1 if i < total % n_clients else 0) for i in range(n_clients)]
        body = submit_body(["true"], JOB_EST_RUNTIME_S)
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(n_clients + 1)
        counter = ctx.Value("l", 0)
        out_q = ctx.Queue()
        procs = [ctx.Process(target=_submit_worker, name=f"bench-client-{i}",
                             args=(i, str(self.socket), shares[i], body, barrier, counter, out_q,
                                   rate / n_clients if rate else None),
                             daemon=True)
                 for i in range(n_clients)]

        def stop_workers() -> None:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)

        self.stack.callback(stop_workers)
        for p in procs:
            p.start()
        self.profile_start("submit")
        cpu0 = process_cpu_s(self.daemon.pid)
        barrier.wait(timeout=120)  # every client connected: go
        t0 = time.perf_counter()
        say(f"{self.kind}: {n_clients} clients submitting {total} jobs")
        results: list[dict] = []
        last_print = t0
        hard_deadline = time.monotonic() + a.submit_timeout
        while len(results) < n_clients:
            try:
                results.append(out_q.get(timeout=0.2))
            except queue_mod.Empty:
                pass
            now = time.perf_counter()
            if now - last_print >= 1.0:
                done = counter.value
                say(f"{self.kind}:   {done}/{total} submitted, {done / (now - t0):.0f}/s")
                last_print = now
            if time.monotonic() > hard_deadline:
                raise RuntimeError(f"submissions did not finish in {a.submit_timeout:.0f}s")
            if len(results) < n_clients and not any(p.is_alive() for p in procs) and out_q.empty():
                raise RuntimeError("client processes died without reporting")
        cpu1 = process_cpu_s(self.daemon.pid)
        self.profile_stop()
        for p in procs:
            p.join(timeout=5)

        starts = [r["start"] for r in results if r["start"]]
        ends = [r["end"] for r in results if r["end"]]
        wall = (max(ends) - min(starts)) if starts and ends else float("nan")
        lat = sorted(x for r in results for x in r["latencies_ms"])
        errors = sum(r["errors"] for r in results)
        ok = sum(r["ok"] for r in results)
        samples = [s for r in results for s in r["error_samples"]][:5]
        t_first = min(starts) if starts else 0.0
        slowest = sorted(((ms, at - t_first) for r in results
                          for ms, at in zip(r["latencies_ms"], r["sent_at"])), reverse=True)[:10]
        out = {
            "clients": n_clients, "requests": len(lat), "ok": ok, "errors": errors,
            "error_samples": samples, "wall_s": round(wall, 3),
            # CPU the daemon process used meanwhile (API, planner, agent): its cost per submit
            "daemon_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None,
            "daemon_cpu_ms_per_submit": (round((cpu1 - cpu0) * 1000 / max(ok, 1), 2)
                                         if cpu0 is not None and cpu1 is not None else None),
            "submits_per_s": round(ok / wall, 1) if wall and wall == wall else None,
            "latency_ms": {"p50": round(percentile(lat, 50), 2), "p90": round(percentile(lat, 90), 2),
                           "p99": round(percentile(lat, 99), 2), "max": round(lat[-1], 2) if lat else None,
                           "mean": round(statistics.fmean(lat), 2) if lat else None},
            # when (s after the first request) the slowest requests were sent: stalls show here
            "slowest": [{"ms": round(ms, 1), "sent_at_s": round(at, 3)} for ms, at in slowest],
        }
        say(f"{self.kind}: {ok} submits in {wall:.2f}s = {out['submits_per_s']}/s, "
            f"p50 {out['latency_ms']['p50']} ms, p99 {out['latency_ms']['p99']} ms, "
            f"max {out['latency_ms']['max']} ms, {errors} errors")
        for s in samples:
            say(f"{self.kind}:   error: {s}")
        return out

    # phase 2: listing ------------------------------------------------------------------

    def fill_to(self, target: int) -> dict:
        """Top the store up to `target` active jobs: insert directly, then one API submit."""
        from sqlalchemy import func, insert, select

        from scheduler.daemon.access import Caller, ServiceConfig
        from scheduler.daemon.service import JobService
        from scheduler.lifecycle import ACTIVE
        from scheduler.store import Store
        from scheduler.store.models import job_events, jobs

        active = sum(v for k, v in self.counts().items() if k in {s.value for s in ACTIVE})
        need = target - active - 1  # the last one goes through the API to wake the planner
        body = submit_body(["true"], JOB_EST_RUNTIME_S)
        store = Store(self.db_url)
        try:
            if need > 0:
                say(f"{self.kind}: inserting {need} jobs directly ({active} active already)")
                caller = Caller(uid=os.geteuid(), gid=os.getegid(), pid=os.getpid())
                svc = JobService(store, ServiceConfig(daemon_uid=os.geteuid()), log_dir=self.tmp / "logs")
                now = datetime.now(timezone.utc)
                try:  # the service's own row shape, exactly as a submit builds it
                    row = svc.submissions.job_row(dict(body), caller, now)
                except AttributeError:
                    raise RuntimeError("Submissions.job_row is gone: update fill_to() in "
                                       "bench/api_bench.py to build job rows the new way") from None
                t0 = time.perf_counter()

                def tx(conn) -> int:
                    done = 0
                    while done < need:
                        n = min(2000, need - done)
                        before = conn.execute(select(func.coalesce(func.max(jobs.c.id), 0))).scalar_one()
                        conn.execute(insert(jobs), [dict(row) for _ in range(n)])
                        ids = conn.execute(select(jobs.c.id).where(jobs.c.id > before)
                                           .order_by(jobs.c.id)).scalars().all()
                        conn.execute(insert(job_events), [
                            {"job_id": i, "from_state": None, "to_state": "PENDING",
                             "actor_uid": caller.uid, "reason": "submitted", "at": now} for i in ids])
                        done += len(ids)
                    return done

                inserted = store.transact(tx)
                say(f"{self.kind}: inserted {inserted} jobs in {time.perf_counter() - t0:.2f}s")
        finally:
            store.dispose()
        c = self.client()
        try:
            c.submit(**body)
        finally:
            c.close()
        say(f"{self.kind}: waiting for the planner to plan {target} active jobs")
        t0 = time.monotonic()
        from scheduler.daemon.planner import MAX_PLANNED_JOBS

        # A tick plans at most MAX_PLANNED_JOBS queued jobs; the rest wait PENDING with that reason.
        planned_at_most = min(target, MAX_PLANNED_JOBS)
        counts = self.wait_for(
            f"{target} active jobs, {planned_at_most} of them planned or running",
            lambda k: (sum(k.get(s.value, 0) for s in ACTIVE) == target
                       and k.get("PLANNED", 0) + k.get("RUNNING", 0) >= planned_at_most),
            timeout_s=self.args.settle_timeout, stable_polls=3)
        say(f"{self.kind}: settled after {time.monotonic() - t0:.1f}s: {counts}")
        return counts

    def bench_queue(self) -> dict:
        a = self.args
        counts = self.fill_to(a.queue_jobs)
        self.profile_start("queue")
        # (a) the API call, one kept-alive client (as a long-lived tool would use it)
        c = self.client()
        api_times: list[float] = []
        api_len = None
        try:
            c.jobs()  # warm-up: connect
            for i in range(a.repeats):
                t0 = time.perf_counter()
                data = c.jobs()
                api_times.append(time.perf_counter() - t0)
                api_len = len(data)
                say(f"{self.kind}:   GET /v1/jobs #{i + 1}: {api_times[-1]:.3f}s, {api_len} jobs")
        finally:
            c.close()
        # (b) the CLI as a user runs it
        exe = Path(sys.executable).parent / "carbonsched"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "scheduler"]
        cmd += ["--socket", str(self.socket), "queue", "--json"]
        cli_times: list[float] = []
        cli_len = None
        cli_ok = True
        for i in range(a.repeats):
            t0 = time.perf_counter()
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, cwd="/", timeout=120)
            cli_times.append(time.perf_counter() - t0)
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: "
                                   f"{p.stderr.decode(errors='replace').strip()}")
            try:
                parsed = json.loads(p.stdout)
                cli_len = len(parsed) if isinstance(parsed, list) else None
            except json.JSONDecodeError as e:
                cli_ok = False
                say(f"{self.kind}:   queue --json output is not JSON: {e}")
            if cli_len != a.queue_jobs:
                cli_ok = False
            say(f"{self.kind}:   queue --json #{i + 1}: {cli_times[-1]:.3f}s, {cli_len} entries, "
                f"{len(p.stdout) / 1e6:.1f} MB")
        self.profile_stop()
        out = {
            "jobs_in_store": counts,
            "api_s": {"median": round(statistics.median(api_times), 4),
                      "min": round(min(api_times), 4), "max": round(max(api_times), 4),
                      "runs": [round(t, 4) for t in api_times]},
            "api_entries": api_len,
            "cli_s": {"median": round(statistics.median(cli_times), 4),
                      "min": round(min(cli_times), 4), "max": round(max(cli_times), 4),
                      "runs": [round(t, 4) for t in cli_times]},
            "cli_entries": cli_len, "cli_output_ok": cli_ok and api_len == a.queue_jobs,
            "cli_command": " ".join(Path(cmd[0]).name if j == 0 else x for j, x in enumerate(cmd)),
        }
        say(f"{self.kind}: GET /v1/jobs median {out['api_s']['median']:.3f}s; "
            f"queue --json median {out['cli_s']['median']:.3f}s ({cli_len} entries)")
        return out

    def planner_ticks(self) -> list[dict]:
        """The planner's own timing lines from the daemon log (logged when it changed something)."""
        import re

        pat = re.compile(r"planner \((\w+)\): (\d+) queued, (\d+) newly planned, (\d+) moved, "
                         r"(\d+) withdrawn(?:, \d+ pinned)? in ([0-9.]+)s")
        out = []
        with contextlib.suppress(OSError):
            for line in self.daemon_log.read_text(errors="replace").splitlines():
                m = pat.search(line)
                if m:
                    out.append({"queued": int(m[2]), "planned": int(m[3]), "moved": int(m[4]),
                                "duration_s": float(m[6])})
        return out


def run_one(kind: str, args: argparse.Namespace) -> dict:
    say(f"===== {kind} =====")
    result: dict = {"db": kind}
    with contextlib.ExitStack() as stack:
        b = Bench(kind, args, stack)
        try:
            b.start_daemon()
            if not args.let_run:
                b.submit_blockers()
            result["submit"] = b.bench_submit()
            say(f"{kind}: latency at an offered load of {TARGET_SUBMITS_PER_S:.0f} submits/s")
            result["submit_paced"] = b.bench_submit(rate=TARGET_SUBMITS_PER_S)
            n_after_submit = len(b.planner_ticks())
            if args.let_run:
                # Jobs ran meanwhile: clear the queue, then occupy the GPUs so the listing
                # sees a stable one.
                b.cancel_active()
                b.submit_blockers()
            result["queue"] = b.bench_queue()
            ticks = b.planner_ticks()
            sub = ticks[:n_after_submit]
            result["planner"] = {
                "ticks_logged_during_submit": len(sub),
                "tick_s_during_submit_total": round(sum(t["duration_s"] for t in sub), 3),
                "tick_s_during_submit_max": max((t["duration_s"] for t in sub), default=None),
                "tick_s_max_with_10k": max((t["duration_s"] for t in ticks[n_after_submit:]), default=None),
            }
            if b.daemon.poll() is not None:
                raise RuntimeError(f"daemon exited with {b.daemon.returncode}:\n{b.log_tail()}")
            # The daemon log shows the planner's work; read it before the stop adds to it.
            # Stop it the way systemd would, and time that too.
            result["daemon_stop"] = b.stop_daemon()
            errors = [line for line in b.daemon_log.read_text(errors="replace").splitlines()
                      if " ERROR " in line or "Traceback" in line]
            result["daemon_log_errors"] = len(errors)
            if errors:
                say(f"{kind}: {len(errors)} ERROR line(s) in the daemon log, first: {errors[0]}")
        except BaseException:
            say(f"{kind}: failed; daemon log tail:\n{b.log_tail()}")
            raise
        finally:
            # Clean-up must finish even if the user presses Ctrl-C again.
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                say(f"{kind}: cleaning up")
                stack.close()
            finally:
                signal.signal(signal.SIGINT, old)
    return result


# -- report -------------------------------------------------------------------------------

def verdicts(r: dict) -> dict:
    s, q, paced = r.get("submit", {}), r.get("queue", {}), r.get("submit_paced", {})
    v = {}
    if s:
        v["submits_per_s"] = (s["submits_per_s"] or 0) >= TARGET_SUBMITS_PER_S and s["errors"] == 0
    if paced:
        v["p99_ms"] = paced["latency_ms"]["p99"] <= TARGET_P99_MS and paced["errors"] == 0
    if q:
        v["queue_api_s"] = q["api_s"]["median"] <= TARGET_QUEUE_S
        v["queue_cli_s"] = q["cli_s"]["median"] <= TARGET_QUEUE_S and q["cli_output_ok"]
    return v


def table(results: dict[str, dict], args: argparse.Namespace) -> str:
    kinds = list(results)
    rows: list[tuple[str, str, list[str]]] = []

    def cell(kind: str, value, key: str | None = None, fmt: str = "{}") -> str:
        if value is None:
            return "-"
        text = fmt.format(value)
        if key is not None:
            ok = results[kind].get("verdicts", {}).get(key)
            text += "  PASS" if ok else "  FAIL"
        return text

    def row(label, target, fn):
        rows.append((label, target, [fn(k) for k in kinds]))

    g = lambda k, *path: _get(results[k], *path)  # noqa: E731
    row("saturation: submits/s", f">= {TARGET_SUBMITS_PER_S:.0f}",
        lambda k: cell(k, g(k, "submit", "submits_per_s"), "submits_per_s", "{:.0f}"))
    row("  latency p50 / p99 / max (ms)", "",
        lambda k: "-" if g(k, "submit", "latency_ms") is None else
        "{:.1f} / {:.1f} / {:.1f}".format(*(g(k, "submit", "latency_ms", x) for x in ("p50", "p99", "max"))))
    row(f"at {TARGET_SUBMITS_PER_S:.0f}/s offered: achieved/s", "",
        lambda k: cell(k, g(k, "submit_paced", "submits_per_s"), None, "{:.0f}"))
    row("  latency p50 (ms)", "", lambda k: cell(k, g(k, "submit_paced", "latency_ms", "p50"), None, "{:.1f}"))
    row("  latency p99 (ms)", f"<= {TARGET_P99_MS:.0f}",
        lambda k: cell(k, g(k, "submit_paced", "latency_ms", "p99"), "p99_ms", "{:.1f}"))
    row("  latency max (ms)", "", lambda k: cell(k, g(k, "submit_paced", "latency_ms", "max"), None, "{:.1f}"))
    row("submit errors", "0", lambda k: cell(k, (g(k, "submit", "errors") or 0) + (g(k, "submit_paced", "errors") or 0)))
    row("daemon CPU per submit (ms)", "",
        lambda k: cell(k, g(k, "submit", "daemon_cpu_ms_per_submit"), None, "{:.2f}"))
    row(f"GET /v1/jobs, {args.queue_jobs} jobs (s, median)", f"<= {TARGET_QUEUE_S}",
        lambda k: cell(k, g(k, "queue", "api_s", "median"), "queue_api_s", "{:.3f}"))
    row(f"queue --json CLI, {args.queue_jobs} jobs (s, median)", f"<= {TARGET_QUEUE_S}",
        lambda k: cell(k, g(k, "queue", "cli_s", "median"), "queue_cli_s", "{:.3f}"))
    row("queue --json entries", str(args.queue_jobs), lambda k: cell(k, g(k, "queue", "cli_entries")))
    row("planner ticks logged while submitting", "",
        lambda k: cell(k, g(k, "planner", "ticks_logged_during_submit")))
    row("  their total / max duration (s)", "",
        lambda k: "-" if g(k, "planner", "ticks_logged_during_submit") is None else
        f"{g(k, 'planner', 'tick_s_during_submit_total'):.2f} / {g(k, 'planner', 'tick_s_during_submit_max') or 0:.2f}")
    row(f"planner tick with {args.queue_jobs} jobs, max (s)", "",
        lambda k: cell(k, g(k, "planner", "tick_s_max_with_10k"), None, "{:.2f}"))
    row("daemon stop after SIGTERM (s)", "",
        lambda k: "-" if g(k, "daemon_stop") is None else
        f"{g(k, 'daemon_stop', 'stop_s'):.1f}" + ("  (hung: SIGKILLed)" if g(k, "daemon_stop", "killed") else ""))

    headers = ("metric", "target", *kinds)
    body = [(label, target, *cells) for label, target, cells in rows]
    widths = [max(len(str(r[i])) for r in [headers, *body]) for i in range(len(headers))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    out = [line(headers), "  ".join("-" * w for w in widths)] + [line(r) for r in body]
    return "\n".join(out)


def _get(d: dict, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


# -- main ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--jobs", type=int, default=3000, help="jobs submitted in total (default 3000)")
    p.add_argument("--clients", type=int, default=16, help="concurrent client processes (default 16)")
    p.add_argument("--queue-jobs", type=int, default=10_000,
                   help="active jobs in the store when timing the listing (default 10000)")
    p.add_argument("--repeats", type=int, default=5, help="timed listings of each kind (median; default 5)")
    p.add_argument("--pg-url", default=DEFAULT_PG_ADMIN_URL,
                   help="PostgreSQL server to create the temporary database on "
                        "[env: CARBONSCHED_TEST_PG_URL] (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--planner-thread", action="store_true",
                   help="run the daemon with --no-planner-process (planning on a daemon thread)")
    p.add_argument("--let-run", action="store_true",
                   help="no blocker jobs while submitting: the emulated agent runs the `true` jobs "
                        "as GPUs free up (planner and agent churn during the measurement)")
    p.add_argument("--log-level", default="INFO", help="the daemon's log level (default INFO, as deployed)")
    p.add_argument("--profile", metavar="DIR", help="record the daemon with py-spy into DIR during each phase")
    p.add_argument("--profile-format", choices=["flamegraph", "speedscope", "raw"], default="flamegraph")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy", help="py-spy executable")
    p.add_argument("--keep", action="store_true", help="keep the temporary state dirs (daemon logs)")
    p.add_argument("--stop-grace", type=float, default=20.0,
                   help="seconds between SIGTERM and SIGKILL when stopping the daemon (default 20)")
    p.add_argument("--submit-timeout", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--settle-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jobs < args.clients or args.clients < 1:
        p.error("--jobs must be at least --clients, and --clients at least 1")
    if args.queue_jobs < args.jobs + N_GPUS + 1:
        p.error(f"--queue-jobs must be at least --jobs + {N_GPUS + 1}")
    args.profile_format_ext = {"flamegraph": "svg", "speedscope": "json", "raw": "txt"}[args.profile_format]
    if args.profile and not shutil.which(args.py_spy):
        p.error(f"--profile needs py-spy ({args.py_spy} not found; pip install py-spy, or --py-spy PATH)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    started = datetime.now(timezone.utc)
    load_before = os.getloadavg()
    say(f"host: {os.cpu_count()} CPUs, load average {load_before[0]:.2f} (1 min)")
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        say("warning: the host is busy; figures will be noisy (the clients, the daemon and the "
            "database all share these CPUs)")
    results: dict[str, dict] = {}
    failed = False
    try:
        for kind in kinds:
            try:
                results[kind] = run_one(kind, args)
            except (RuntimeError, OSError, ImportError) as e:
                failed = True
                say(f"{kind}: benchmark failed: {e}")
                results[kind] = {"db": kind, "error": str(e).splitlines()[0] if str(e) else type(e).__name__}
            except Exception as e:  # e.g. a database that cannot be created
                failed = True
                say(f"{kind}: benchmark failed: {type(e).__name__}: {e}")
                results[kind] = {"db": kind, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
            results[kind]["verdicts"] = verdicts(results[kind])
    except KeyboardInterrupt:
        say("interrupted; everything started was stopped")
        return 130

    print()
    print(f"carbonsched API benchmark: {args.clients} client processes, {args.jobs} submits, "
          f"{args.queue_jobs} active jobs for the listing; emulated {EMULATED_FLEET}; "
          f"{os.cpu_count()} CPUs (load {load_before[0]:.1f} before); Python {platform.python_version()}"
          + ("; --let-run" if args.let_run else ""))
    print(table(results, args))
    for kind, r in results.items():
        if "error" in r:
            print(f"{kind}: FAILED: {r['error']}")
    if args.json:
        doc = {
            "benchmark": "carbonsched api_bench", "started_at": started.isoformat(),
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                     "platform": platform.platform(), "loadavg_1m_before": round(load_before[0], 2),
                     "loadavg_1m_after": round(os.getloadavg()[0], 2)},
            "params": {"db": args.db, "jobs": args.jobs, "clients": args.clients,
                       "queue_jobs": args.queue_jobs, "repeats": args.repeats,
                       "emulate": EMULATED_FLEET, "let_run": args.let_run, "log_level": args.log_level},
            "targets": {"submits_per_s": TARGET_SUBMITS_PER_S, "p99_ms": TARGET_P99_MS,
                        "queue_s": TARGET_QUEUE_S},
            "results": results,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"figures written to {args.json}")
    all_pass = all(r.get("verdicts") and all(r["verdicts"].values()) for r in results.values())
    return 1 if failed else (0 if all_pass else 2)


if __name__ == "__main__":
    sys.exit(main())
