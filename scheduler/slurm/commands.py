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


class SlurmCommands:
    """The Slurm tools of one cluster. `conf` is its slurm.conf (None: Slurm's default)."""

    def __init__(self, conf: Path | None = None, *, timeout_s: float = 30.0) -> None:
        self.conf = conf
        self.timeout_s = timeout_s
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()  # wall time spent in each tool

    def run(self, argv: list[str], *, as_user: Identity | None = None,
            env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run one tool; raise SlurmError on a non-zero exit (unless check=False) or timeout.

        With `as_user` (and this process root), the tool runs with that uid, gid and groups, so
        Slurm records the job as theirs: carbonsched never submits a user's job as root.
        """
        full_env = dict(env if env is not None else os.environ)
        if self.conf is not None:
            full_env["SLURM_CONF"] = str(self.conf)
        kwargs: dict = {}
        if as_user is not None and os.geteuid() == 0 and as_user.uid != 0:
            kwargs = dict(user=as_user.uid, group=as_user.gid, extra_groups=list(as_user.groups))
        self.calls[argv[0]] += 1
        t0 = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=full_env,
                                  timeout=self.timeout_s, cwd="/", **kwargs)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer within {self.timeout_s:g}s "
                             "(is slurmctld up?)") from None
        except OSError as e:
            raise SlurmError(f"cannot run {argv[0]}: {e}") from e
        finally:
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
