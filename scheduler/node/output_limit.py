"""A job's output, copied into its log files up to the job's output limit (issue 48).

Without a limit one job's `head -c 700M /dev/zero` filled the disk its logs share with the
store, and every user's submits, the dispatch loop and even root's cancels failed. So the
job never holds its log files: it writes into pipes, and its supervisor copies what comes
through into the files, counting. Past `limit_bytes` (all streams of the job together)
the rest is read and discarded, so the job runs on and never blocks; one marker line in
each cut stream says where and why. A disk that fills up meanwhile cuts the output the same
way (the job's outcome still gets recorded: the supervisor waits for space for that).

Standard library only: the supervisor imports this and must start fast.
"""

from __future__ import annotations

import errno
import os
import threading

MARKER = "carbonsched: output truncated"
READ_BYTES = 64 * 1024
JOIN_S = 10.0  # how long the job's end waits for the last of its output to be copied


class OutputCopier:
    """Copy a job's stdout and stderr from pipes into its log files, within one byte budget.

    `child_fds` are what the job gets as its stdout and stderr; `close_child_ends` once it
    has started (else the copies never see the end of the output); `finish` when it ended:
    the streams that were cut, in order (empty: none)."""

    def __init__(self, out_fd: int, err_fd: int, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._left = limit_bytes
        self._lock = threading.Lock()
        self._cut: list[str] = []
        self._child: list[int] = []
        self._threads: list[threading.Thread] = []
        for stream, log_fd in (("stdout", out_fd), ("stderr", err_fd)):
            read_fd, write_fd = os.pipe()
            os.set_inheritable(read_fd, False)
            self._child.append(write_fd)
            t = threading.Thread(target=self._copy, args=(stream, read_fd, log_fd),
                                 name=f"copy-{stream}", daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def child_fds(self) -> tuple[int, int]:
        return self._child[0], self._child[1]

    def close_child_ends(self) -> None:
        for fd in self._child:
            try:
                os.close(fd)
            except OSError:
                pass
        self._child = [-1, -1]

    def finish(self, timeout_s: float = JOIN_S) -> list[str]:
        """Wait (bounded) for the copies to reach the end of the job's output; the cut streams."""
        self.close_child_ends()
        for t in self._threads:
            t.join(timeout_s)
        with self._lock:
            return [s for s in ("stdout", "stderr") if s in self._cut]

    def _take(self, n: int) -> int:
        with self._lock:
            k = min(n, self._left)
            self._left -= k
            return k

    def _cut_stream(self, stream: str, log_fd: int, why: str) -> None:
        with self._lock:
            self._cut.append(stream)
        try:
            _write_all(log_fd, f"\n{MARKER}: {why}; the rest was discarded\n".encode())
        except OSError:
            pass  # a full disk: the marker is lost, `show` still says so

    def _copy(self, stream: str, read_fd: int, log_fd: int) -> None:
        cut = False
        try:
            while True:
                data = os.read(read_fd, READ_BYTES)
                if not data:
                    return
                if cut:
                    continue
                k = self._take(len(data))
                try:
                    if k:
                        _write_all(log_fd, data[:k])
                except OSError as e:  # never stop reading: a job whose pipe fills would block
                    cut = True
                    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
                    self._cut_stream(stream, log_fd, "the log disk is full" if full
                                     else f"writing the log failed ({e.strerror or e})")
                    continue
                if k < len(data):
                    cut = True
                    self._cut_stream(stream, log_fd, f"the job's output reached its limit of "
                                                     f"{self.limit_bytes} bytes (job_output_limit_mib)")
        finally:
            os.close(read_fd)
            os.close(log_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
