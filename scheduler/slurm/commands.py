"""Running the Slurm command-line tools (sbatch, squeue, sinfo, scontrol, scancel): with a
timeout, the cluster's SLURM_CONF, as a job's owner where it matters, and clear errors.

The tools are Slurm's stable interface (22.05 has `--json` for squeue and sinfo); slurmrestd
is not assumed to be running. Calls are counted per tool, for the benchmark.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class SlurmError(RuntimeError):
    """A Slurm tool failed, timed out or printed what we cannot read."""


@dataclass(frozen=True)
class Identity:
    """Who a command runs as: a job's owner (uid, gid, supplementary groups)."""
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


# What every Slurm tool runs with, whoever asked for the command: Slurm reads a time without
# a zone (`--begin`, `StartTime=`) in the tool's TZ, and takes `SBATCH_*`/`SLURM_*` variables
# as options, so neither the agent's nor a job's environment may reach the tools themselves.
TOOL_LANG = "C.UTF-8"
TOOL_TZ = "UTC"
# The umask a job starts with, local (scheduler/node/supervise.py) or Slurm (sbatch hands its
# own to the job as SLURM_UMASK): the usual login default, not the daemon's own 0077 (its unit
# keeps the store and run records private; a job's files are its owner's business).
JOB_UMASK = 0o022


def tool_env(conf: Path | None) -> dict[str, str]:
    """The fixed environment of a Slurm tool: PATH, LANG, TZ=UTC and SLURM_CONF, nothing else."""
    env = {"PATH": os.environ.get("PATH") or "/usr/bin:/bin", "LANG": TOOL_LANG, "TZ": TOOL_TZ}
    conf_path = str(conf) if conf is not None else os.environ.get("SLURM_CONF")
    if conf_path:
        env["SLURM_CONF"] = conf_path
    return env


class SlurmCommands:
    """The Slurm tools of one cluster. `conf` is its slurm.conf (None: Slurm's default)."""

    def __init__(self, conf: Path | None = None, *, timeout_s: float = 30.0) -> None:
        self.conf = conf
        self.timeout_s = timeout_s
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()  # wall time spent in each tool

    def run(self, argv: list[str], *, as_user: Identity | None = None,
            job_env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run one tool; raise SlurmError on a non-zero exit (unless check=False) or timeout.

        With `as_user` (and this process root), the tool runs with that uid, gid and groups, so
        Slurm records the job as theirs: carbonsched never submits a user's job as root.
        The tool itself always runs with `tool_env` (TZ=UTC, no SBATCH_* or other options by
        environment). `job_env` (sbatch only) is the job's own environment, exactly: it goes
        to sbatch as an `--export-file` descriptor (NUL-separated NAME=value, so any value
        survives), which Slurm gives the job instead of sbatch's environment.
        """
        full_env = tool_env(self.conf)
        kwargs: dict = {"umask": JOB_UMASK}
        if as_user is not None and os.geteuid() == 0 and as_user.uid != 0:
            kwargs.update(user=as_user.uid, group=as_user.gid, extra_groups=list(as_user.groups))
        self.calls[argv[0]] += 1
        t0 = time.monotonic()
        env_file = None
        try:
            if job_env is not None:
                env_file = tempfile.TemporaryFile()  # unlinked: only the descriptor reaches sbatch
                env_file.write(b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0"
                                        for k, v in job_env.items()))
                env_file.flush()
                env_file.seek(0)
                argv = [argv[0], f"--export-file={env_file.fileno()}", *argv[1:]]
                kwargs["pass_fds"] = (env_file.fileno(),)
            done = subprocess.run(argv, capture_output=True, text=True, env=full_env,
                                  timeout=self.timeout_s, cwd="/", **kwargs)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer within {self.timeout_s:g}s "
                             "(is slurmctld up?)") from None
        except OSError as e:
            raise SlurmError(f"cannot run {argv[0]}: {e}") from e
        finally:
            if env_file is not None:
                env_file.close()
            self.seconds[argv[0]] += time.monotonic() - t0
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:2])} failed (exit {done.returncode}): "
                             f"{(done.stderr or done.stdout).strip()[:500]}")
        return done

    def json(self, argv: list[str]) -> dict:
        """Run a tool that prints JSON (`squeue --json`, `sinfo --json`) and parse it."""
        out = self.run(argv).stdout
        try:
            data = json.loads(out)
        except json.JSONDecodeError as e:
            raise SlurmError(f"{argv[0]} printed unreadable JSON: {e}") from e
        errors = data.get("errors") or []
        if errors:
            raise SlurmError(f"{argv[0]} reported errors: {errors}")
        return data
