"""The versions of the libraries a plan depends on, for every benchmark's JSON.

A simulated replay repeats exactly for one build of OR-Tools and NumPy (cpsat's budget is
counted in work, `policies.solvers.work_clock`), not across builds: CP-SAT's search changes between
releases, and with it cpsat's rows. A figure is comparable with another only where these match.
"""

from __future__ import annotations

import platform
from importlib import metadata


def library_versions() -> dict[str, str]:
    """python, ortools and numpy as installed ("absent" where one is not)."""
    out = {"python": platform.python_version()}
    for dist in ("ortools", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out
