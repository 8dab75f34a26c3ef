"""What a job says it did: the prompts and tokens it served, from its metrics file.

Every job finds the path of its metrics file in `$CARBONSCHED_METRICS_FILE`. The file exists
when the job starts (empty, owned by the job's user, mode 0600) and is read by the node agent
when the job ends, also after an agent restart. Its format:

    # comments and blank lines are skipped
    prompts=1000
    input_tokens=512000
    output_tokens=256000

One `KEY=VALUE` per line (spaces around `=` allowed), KEY one of `prompts`, `input_tokens`,
`output_tokens`, VALUE a whole number from 0 to 10^15. Append as often as you like, e.g. once
per batch with running totals: the last value of each key wins. Any other line is ignored and
the job's history says how many were (`carbonsched show JOB`); a job never fails for it.

The file lives beside the job's logs (`STATE_DIR/logs/JOB.metrics`), not in its run
directory: that holds the job's environment and stays root-only. The agent reads the file as
root, so it reads only what the job itself could: a regular file (no symlink, FIFO or device)
owned by the job's user, and at most its last `MAX_READ_BYTES`. The job's user cannot replace
the file (the logs directory is root's), only write to it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "CARBONSCHED_METRICS_FILE"
KEYS = ("prompts", "input_tokens", "output_tokens")
MAX_VALUE = 10**15
MAX_READ_BYTES = 1 << 20
_LINE = re.compile(r"^\s*([a-z_]+)\s*=\s*([0-9]+)\s*$")


@dataclass(frozen=True)
class ReportedWork:
    """The job's own figures (None: not reported) and a note on anything not taken."""

    prompts: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    note: str | None = None

    def values(self) -> dict[str, int]:
        """The reported figures as store columns (`reported_*`), only those present."""
        return {f"reported_{k}": v for k in KEYS if (v := getattr(self, k)) is not None}


def metrics_path(log_root: Path, job_id: int) -> Path:
    return Path(log_root) / f"{job_id}.metrics"


def create(path: Path, uid: int, gid: int) -> None:
    """Create the job's empty metrics file, owned by the job's user (the supervisor does
    this as root before it starts the command). An existing file is left alone."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    try:
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def parse(text: str) -> tuple[dict[str, int], int, str | None]:
    """The last value of each key, how many lines were ignored, and the first of them."""
    found: dict[str, int] = {}
    ignored, first = 0, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if m and m.group(1) in KEYS and int(m.group(2)) <= MAX_VALUE:
            found[m.group(1)] = int(m.group(2))
            continue
        ignored += 1
        if first is None:
            first = line.strip()[:60]
    return found, ignored, first


def read(path: Path, owner_uid: int) -> ReportedWork:
    """What the job reported in `path`; refused (with a note) when the file is not the job's
    own regular file. A missing or empty file reports nothing and notes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return ReportedWork()
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        return ReportedWork(note=f"metrics file not read: {why}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ReportedWork(note="metrics file not read: not a regular file")
        if os.geteuid() == 0 and st.st_uid != owner_uid:
            return ReportedWork(note=f"metrics file not read: owned by uid {st.st_uid}, not the job's user")
        skipped = max(0, st.st_size - MAX_READ_BYTES)
        if skipped:
            os.lseek(fd, skipped, os.SEEK_SET)
        data = os.read(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    if skipped:
        text = text.partition("\n")[2]  # the first line is cut in two
    found, ignored, first = parse(text)
    notes = []
    if skipped:
        notes.append(f"only its last {MAX_READ_BYTES // 1024} KiB read ({st.st_size:,} bytes)")
    if ignored:
        notes.append(f"{ignored} line{'s' * (ignored != 1)} ignored (first: {first!r})")
    return ReportedWork(**found, note=("metrics file: " + "; ".join(notes)) if notes else None)
