"""A real, throw-away Slurm cluster for tests and benchmarks: munged, slurmctld and slurmd
on loopback with their own configuration, state and ports in a temporary directory.

GPUs are GRES entries whose `File=` are character devices made with `mknod PATH c 1 3`
(/dev/null's numbers): Slurm then hands jobs CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES as
on a real GPU node. Needs root and Debian's `slurm-wlm` and `munge` packages.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def missing_reason() -> str | None:
    """Why a real Slurm cluster cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd runs jobs as their users)"
    for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "munged", "mknod"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (apt-get install slurm-wlm munge)"
    return None


def _sbin(tool: str) -> str:
    return shutil.which(tool) or str(Path("/usr/sbin", tool))


@dataclass
class SlurmNode:
    """One slurmd: its name, carbon zone (as a `zone_XX` feature) and GPU types in index order."""
    name: str
    zone: str
    gpus: list[tuple[str, int]]  # [(gres type, count)], numbered in this order from 0
    cpus: int = 64


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[SlurmNode]
    partition: str = "carbon"
    ctld_port: int = 16817  # the slurmds listen on the next ports, one each
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for d in ("state", "spool", "log", "dev"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=cstest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CryptoType=crypto/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd'}-%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,sched_min_interval=100000,bf_interval=1,defer_batch=0",
            "MinJobAge=3600", "MaxJobCount=20000",
            "ReturnToService=2", "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none", "KillWait=2", "InactiveLimit=0", "Waittime=0",
            "SlurmctldTimeout=30", "SlurmdTimeout=60", "MessageTimeout=20",
        ]
        gres_lines = []
        for i, node in enumerate(self.nodes):
            gres = ",".join(f"gpu:{t}:{n}" for t, n in node.gpus)
            (self.root / "spool" / node.name).mkdir(exist_ok=True)
            lines.append(f"NodeName={node.name} NodeHostname={host} NodeAddr=127.0.0.1 "
                         f"Port={self.ctld_port + 1 + i} CPUs={node.cpus} RealMemory=100000 Gres={gres} Features=zone_{node.zone} "
                         "State=UNKNOWN")
            index = 0
            for gres_type, count in node.gpus:
                for _ in range(count):
                    dev = self.root / "dev" / f"{node.name}-gpu{index}"
                    if not dev.exists():
                        subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True, timeout=10)
                    gres_lines.append(f"NodeName={node.name} Name=gpu Type={gres_type} File={dev}")
                    index += 1
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        lines.append(f"PartitionName=debug Nodes={names} Default=NO MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "gres.conf").write_text("\n".join(gres_lines) + "\n")

    def start(self, timeout_s: float = 60.0) -> None:
        """Start munged (unless one answers already), slurmctld and one slurmd per node;
        return once every node is idle."""
        busy = [p for p in range(self.ctld_port, self.ctld_port + 1 + len(self.nodes)) if not _port_free(p)]
        if busy:
            raise RuntimeError(f"TCP port(s) {busy} in use: another Slurm (or a left-over test cluster) "
                               "runs here; stop it or choose other ports")
        ensure_munged()
        self.write_config()
        env = dict(os.environ, **self.env)
        ctld = subprocess.Popen([_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=env,
                                stdout=subprocess.DEVNULL, stderr=open(self.root / "log" / "slurmctld.err", "ab"))
        self.procs.append(ctld)
        for node in self.nodes:
            argv = [_sbin("slurmd"), "-D", "-f", str(self.conf)]
            if len(self.nodes) > 1:
                argv += ["-N", node.name]
            self.procs.append(subprocess.Popen(
                argv, env=env, stdout=subprocess.DEVNULL,
                stderr=open(self.root / "log" / f"slurmd-{node.name}.err", "ab")))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}; see {self.root / 'log'}")
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True,
                                 text=True, timeout=10)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if out.returncode == 0 and states and all(s == "idle" for s in states.values()) \
                    and len(states) == len(self.nodes):
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"Slurm nodes not idle after {timeout_s:g}s; see {self.root / 'log'}")

    def stop(self) -> None:
        """Cancel all jobs, then stop the daemons (munged is left running: it is shared)."""
        env = dict(os.environ, **self.env)
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True, timeout=10)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def munge_works() -> bool:
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=5)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=5)
        return dec.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_munged() -> None:
    """Start munged as the munge user (with a key, made if missing) unless one answers.

    Every pytest-xdist worker calls this at once on a fresh machine: a lock file makes one of
    them start munged while the others wait, and a munged that another worker started (its
    socket lock taken) counts as started."""
    if munge_works():
        return
    run_dir = MUNGE_SOCKET.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    run_dir.chmod(0o755)
    with open(Path(tempfile.gettempdir()) / "carbonsched-tests-munged.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if munge_works():
            return
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run([_sbin("mungekey"), "--create", "--keyfile", str(key)], check=True,
                           timeout=30)
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        started = subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged")],
                                 capture_output=True, text=True, timeout=30)
        for _ in range(100):
            if munge_works():
                _mark_munged_started()
                return
            time.sleep(0.1)
    raise RuntimeError(f"munged did not start ({started.stderr.strip() or started.returncode}): "
                       "munge -n | unmunge fails")


MUNGED_PID_FILE = Path("/run/munge/munged.pid")


def _mark_munged_started() -> None:
    """Tell the test run (tests/suite_hygiene.py) that it started munged, so that it stops it."""
    run_dir = os.environ.get("CARBONSCHED_TEST_RUN_DIR")
    if run_dir:
        (Path(run_dir) / "munged-started-by-the-suite").touch()


def stop_munged(timeout_s: float = 30.0) -> None:
    """Stop the munged that `ensure_munged` started (its pid file names it)."""
    try:
        pid = int(MUNGED_PID_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
