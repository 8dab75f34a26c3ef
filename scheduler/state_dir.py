"""A state directory belongs to one store.

The daemon's and agents' state directories keep per-job files by job id: run records
(`run/ID/`, the job's environment among them) and logs and metrics files (`logs/ID.*`). Job
ids are unique only within one store, so a daemon restarted on the same state directory with
another database (new, restored or replaced) would hand its job 1 the files of the old store's
job 1: another user's output, reopened and chowned to the new owner. So the directory records
the id of the store it serves (`store-id`, `scheduler.store.identity`); on a mismatch, the
other store's `run/` and `logs/` are moved aside, root-only, before anything runs:

    STATE_DIR/previous-store-<ID>-<UTC time>/{run,logs}   (mode 0700)

A state directory from before store ids (no `store-id` file) is taken to be this store's:
that is an upgrade of carbonsched on the same database, whose running jobs must be adopted.

A log directory kept apart from the state directory (`log_dir`, issue 48; often a mount
point, so never renamed itself) is bound the same way with a `store-id` of its own: another
store's files in it are moved into `LOG_DIR/previous-store-<ID>-<UTC time>/` (mode 0700).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)

MARK = "store-id"
PER_STORE = ("run", "logs")


def bind_state_dir(state_dir: Path, store_id: str) -> Path | None:
    """Make `state_dir`'s per-job files this store's; return where another store's went
    (None when there were none)."""
    state_dir = Path(state_dir)
    return _bind(state_dir, store_id, lambda: [state_dir / d for d in PER_STORE if (state_dir / d).exists()],
                 "state directory")


def bind_log_dir(log_dir: Path, store_id: str) -> Path | None:
    """Make a separate log directory's files this store's (see the module's docstring);
    return where another store's went (None when there were none)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    return _bind(log_dir, store_id, lambda: [p for p in log_dir.iterdir()
                                             if p.name != MARK and not p.name.startswith(("previous-store-", MARK))],
                 "log directory")


def _bind(directory: Path, store_id: str, per_store: Callable[[], list[Path]], what: str) -> Path | None:
    """Record `store_id` in `directory`; where it served another store, first move that
    store's `per_store()` entries into a root-only `previous-store-<ID>-<UTC time>/`."""
    mark = directory / MARK
    try:
        bound = mark.read_text("utf-8").strip()
    except FileNotFoundError:
        bound = None
    if bound == store_id:
        return None
    moved: Path | None = None
    present = per_store() if bound is not None else []
    if present:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        moved = directory / f"previous-store-{_safe(bound)}-{stamp}"
        moved.mkdir(mode=0o700)
        moved.chmod(0o700)
        for p in present:
            os.rename(p, moved / p.name)
        log.warning("%s %s served another store (%s), this is %s: %s moved to %s, so no job of this "
                    "store gets that store's files", what, directory, bound, store_id,
                    " and ".join(p.name for p in present), moved)
    tmp = mark.with_name(MARK + ".tmp")
    tmp.write_text(store_id + "\n", "utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, mark)
    return moved


def _safe(text: str) -> str:
    return "".join(c for c in text if c.isalnum())[:32] or "unknown"
