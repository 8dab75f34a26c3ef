"""A result that one test run computes once and its xdist workers share.

Work stealing may hand the tests of one module to several workers; a module fixture that
runs a daemon for a minute (the convergence run) would then run once on each. Here the
first worker to ask computes the value under a lock in the run's directory and leaves it
there, pickled; the others wait on the lock and read it. A failed computation leaves
nothing, so each worker that asks fails on its own.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable
from typing import TypeVar

from suite_hygiene import run_dir

T = TypeVar("T")


def once_per_run(name: str, compute: Callable[[], T]) -> T:
    """`compute()`, computed once for the whole run (once per process outside a run that
    `suite_hygiene.start_run` set up)."""
    directory = run_dir()
    if directory is None:
        return compute()
    result = directory / f"once-{name}.pickle"
    with open(directory / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if result.exists():
                return pickle.loads(result.read_bytes())
            value = compute()
            partial = result.with_suffix(".partial")
            partial.write_bytes(pickle.dumps(value))
            os.replace(partial, result)
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
