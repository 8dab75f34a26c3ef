"""The policies' derived tables, computed once and kept on disk for every later process.

The seed profiles (`policies.model.energy.seed_profiles`), the performance model's named workloads
(`policies.model.perf_model.presets`), its fit (`policies.model.perf_model.fit`) and the MLPerf
results' stack speeds under that fit (`perf_model.primed_tables`) are derived from the
packaged catalog and measurements by a least-squares fit: several seconds of CPU in every
process that plans, admits or emulates (the daemon, its planner and preview workers, each
agent, each simulation). They change only when the policies' code or data do, so the first
process computes them and stores them under a name that hashes every file of the `policies`
package (and the Python and numpy versions); later processes load them in milliseconds. A
change to any of those files gives a new name, so a stale table is never read.

The cache directory: `$CARBONSCHED_CACHE_DIR`, else `$XDG_CACHE_HOME/carbonsched`, else
`~/.cache/carbonsched`. A file is loaded only when it and its directory belong to this user
and nobody else may write them (it is a pickle: whoever can write it could run code in the
daemon). Any failure to read or write the cache only costs the computation.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the stored shape changes


def cache_dir() -> Path:
    """Where the tables are kept (see the module docstring)."""
    explicit = os.environ.get("CARBONSCHED_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "carbonsched"


def tables_key() -> str:
    """A digest of everything the tables derive from: the policies package's files, the
    Python and numpy versions, and this module's format."""
    import numpy
    import policies

    root = Path(policies.__file__).resolve().parent
    h = hashlib.sha256(f"{FORMAT}|{sys.version}|{numpy.__version__}".encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _trusted(path: Path) -> bool:
    """Owned by this user and writable by nobody else: the file and its directory."""
    uid = os.geteuid()
    for p in (path.parent, path):
        st = p.stat()
        if st.st_uid != uid or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def warm_policy_tables(directory: Path | None = None) -> str:
    """Make the policies' derived tables available to this process: loaded from the cache,
    or computed and stored there. Returns how ("loaded", "computed", "computed (not stored:
    why)")."""
    from policies.model import energy, perf_model

    directory = directory or cache_dir()
    try:
        path = directory / f"policy-tables-{tables_key()}.pickle"
    except OSError as e:
        log.info("policy tables: cannot read the policies package (%s); computing them", e)
        energy.seed_profiles()
        return "computed (not stored: the package could not be read)"
    try:
        if path.exists() and _trusted(path):
            with open(path, "rb") as f:
                tables = pickle.load(f)
            perf_model.prime(presets=tables["presets"], fit=tables["fit"], stack_speeds=tables["stack_speeds"])
            energy.prime_seed_profiles(tables["seed_profiles"])
            return "loaded"
        if path.exists():
            log.warning("policy tables: ignoring %s (not owned by uid %s, or writable by others)",
                        path, os.geteuid())
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, AttributeError, TypeError) as e:
        log.info("policy tables: %s unreadable (%s); computing them", path, e)
    tables = {"seed_profiles": energy.seed_profiles(), **perf_model.primed_tables()}
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".policy-tables-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(tables, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        log.info("policy tables: not stored in %s (%s)", directory, e)
        return f"computed (not stored: {e})"
    return "computed"
