"""The per-job checkpoint directory of an interruptible job (issue 30).

`$CARBONSCHED_CHECKPOINT_DIR` is `ROOT/JOB_ID`: created by the agent (root) before the
job's first segment, owned by the job's user with mode 0700, kept across its segments and
removed when the job ends. ROOT belongs to root (0711), so no user can plant or swap a
job's directory; the directory itself is never followed through a symlink, and one found
owned by someone else is not handed over but replaced. For a checkpoint job that may move
between nodes, ROOT must be storage the nodes share (the agent's `checkpoint_root`).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

log = logging.getLogger(__name__)

ROOT_MODE = 0o711
DIR_MODE = 0o700


class CheckpointDirError(OSError):
    """The checkpoint directory could not be made safe for its job."""


def prepare_root(root: Path) -> None:
    """Create ROOT (0711) if missing; refuse a symlink there."""
    root.mkdir(parents=True, exist_ok=True, mode=ROOT_MODE)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CheckpointDirError(f"checkpoint root {root} is not a plain directory")
    if os.geteuid() == 0 and st.st_uid != 0:
        raise CheckpointDirError(f"checkpoint root {root} is not owned by root")
    os.chmod(root, ROOT_MODE)


def ensure_job_dir(root: Path, job_id: int, uid: int, gid: int) -> Path:
    """The job's checkpoint directory, created (or checked) owned by `uid` with mode 0700.

    Everything is done through a descriptor of ROOT and O_NOFOLLOW|O_DIRECTORY opens, so a
    symlink at the job's name is never followed; a non-directory or another user's directory
    there is removed and the directory made afresh (empty: nothing of another user's is
    handed to this job)."""
    prepare_root(root)
    name = str(int(job_id))
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(3):
            try:
                os.mkdir(name, DIR_MODE, dir_fd=root_fd)
            except FileExistsError:
                pass
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            except OSError:  # a symlink or a file where the directory should be
                _remove_entry(root_fd, name)
                continue
            try:
                st = os.fstat(fd)
                if os.geteuid() == 0:
                    if st.st_uid not in (uid, 0):
                        os.close(fd)
                        fd = -1
                        _remove_entry(root_fd, name)
                        continue
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, DIR_MODE)
            finally:
                if fd >= 0:
                    os.close(fd)
            return root / name
    finally:
        os.close(root_fd)
    raise CheckpointDirError(f"cannot make the checkpoint directory {root / name}: it keeps being replaced")


def _remove_entry(root_fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=root_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=root_fd)  # fd-based on Linux: never follows symlinks inside
    else:
        os.unlink(name, dir_fd=root_fd)


def remove_job_dir(root: Path, job_id: int) -> None:
    """Remove the job's checkpoint directory once it has ended (missing: nothing to do)."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _remove_entry(root_fd, str(int(job_id)))
    except OSError as e:
        log.warning("job %s: removing its checkpoint directory under %s failed: %s", job_id, root, e)
    finally:
        os.close(root_fd)
