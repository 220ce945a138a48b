"""The audit log: one JSON line per tool call, best effort, never content, never raw IDs.

The file is created with mode 0600 from its first byte (``os.open`` with the mode) in a 0700 directory, and
:func:`open_audit_file` refuses anything planted at its path. A failed write produces one generic warning on
stderr and never fails or hides a call's result.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from code_sandbox.liveness import default_state_dir

logger = logging.getLogger(__name__)

AuditValue = int | bool | str | None

# O_NOFOLLOW: a symlink at the path fails (ELOOP) instead of redirecting the writes. O_NONBLOCK: a FIFO with no
# reader fails (ENXIO) instead of blocking the writer forever. O_NOCTTY: a terminal device never becomes ours.
_OPEN_FLAGS = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
# What opening a symlink, a FIFO with no reader, a socket or a directory fails with under _OPEN_FLAGS.
_NOT_A_FILE_ERRNOS = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR})


class UnsafeAuditFileError(OSError):
    """The audit log's path holds something other than a regular file owned by this user with mode 0600."""


def default_audit_path() -> Path:
    """``audit.jsonl`` in the state directory (:func:`code_sandbox.liveness.default_state_dir`)."""
    return default_state_dir() / "audit.jsonl"


def open_audit_file(path: Path) -> int:
    """Open the audit log for appending, creating it (mode 0600) and its directory (mode 0700) when missing.

    The one rule for what may be written to: never through a symlink, never blocking on a FIFO, and only a
    regular file owned by this user with no group or other permission bits.

    :param path: the audit log's path.
    :return: a file descriptor open for appending; the caller closes it.
    :raises UnsafeAuditFileError: something else is at the path; nothing was written and no descriptor is left open.
    :raises OSError: the file or its directory cannot be created or opened.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        # The mode is applied at creation, so the file is never readable by others, not even for a moment.
        fd = os.open(path, _OPEN_FLAGS, 0o600)
    except OSError as error:
        if error.errno in _NOT_A_FILE_ERRNOS:
            raise UnsafeAuditFileError("the audit log's path is not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        if not _is_private_regular_file(info):
            raise UnsafeAuditFileError("the audit log's path is not a regular file owned by this user with mode 0600")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_private_regular_file(info: os.stat_result) -> bool:
    if not stat.S_ISREG(info.st_mode):
        return False
    if sys.platform == "win32":  # no owner uid or permission bits to check there
        return True
    # One link only: a hard link planted at the path would make us append to another file of ours.
    return info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0 and info.st_nlink == 1


class AuditLog:
    """Appends audit records from a background writer thread, so a slow disk never delays a call.

    At most ``max_queued`` records wait for the writer; past that :meth:`record` drops records (counted in
    :attr:`dropped`) rather than block or grow. Disabled instances do nothing. :meth:`close` writes what is
    queued (bounded in time).
    """

    def __init__(self, path: Path | None, *, enabled: bool, max_queued: int = 10_000) -> None:
        self.path = path or default_audit_path()
        self.enabled = enabled
        # A writer stops when it takes its own stop event from the queue, or at once when that event is set.
        self._queue: queue.Queue[str | threading.Event] = queue.Queue(max_queued)
        self._writer: threading.Thread | None = None
        self._stop = threading.Event()
        self._warned = False
        self._drop_lock = threading.Lock()
        self._dropped = 0

    @property
    def dropped(self) -> int:
        """How many records were dropped because the writer had fallen ``max_queued`` records behind."""
        return self._dropped

    def record(
        self,
        *,
        tool: str,
        session_hash: str | None,
        result: str,
        duration_ms: int,
        counts: Mapping[str, AuditValue] | None = None,
    ) -> None:
        """Append one record. ``counts`` holds numbers and flags only (files, bytes, exit code, ...)."""
        if not self.enabled:
            return
        line = json.dumps(
            {
                "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "tool": tool,
                "session": session_hash,
                "result": result,
                "duration_ms": duration_ms,
                **(counts or {}),
            },
            separators=(",", ":"),
        )
        if self._writer is None:
            self._stop = threading.Event()
            self._writer = threading.Thread(
                target=self._write_queued, args=(self._stop,), name="code-sandbox audit", daemon=True
            )
            self._writer.start()
        try:
            self._queue.put_nowait(line + "\n")
        except queue.Full:
            with self._drop_lock:
                self._dropped += 1
                first = self._dropped == 1
            if first:
                logger.warning("the audit log is falling behind; some records are dropped and calls continue")

    def close(self, timeout: float = 2.0) -> None:
        """Write every queued record, waiting at most ``timeout`` seconds; what is left then is not written."""
        writer, stop = self._writer, self._stop
        if writer is None:
            return
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(stop, timeout=timeout)
        except queue.Full:
            # The writer is stuck or far behind: it stops after its current record. Should it have emptied the
            # queue meanwhile and be waiting in get(), the event itself wakes it.
            stop.set()
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(stop)
        writer.join(max(0.0, deadline - time.monotonic()))
        self._writer = None

    def _write_queued(self, stop: threading.Event) -> None:
        while not stop.is_set():
            item = self._queue.get()
            if item is stop:
                return
            if isinstance(item, str):  # else the stop event of an earlier writer that timed out
                self._append_or_warn(item)

    def _append_or_warn(self, line: str) -> None:
        try:
            fd = open_audit_file(self.path)
            with os.fdopen(fd, "a", encoding="utf-8") as stream:
                stream.write(line)
        except OSError:
            if not self._warned:
                self._warned = True
                logger.warning("the audit log could not be written; calls continue without it")
