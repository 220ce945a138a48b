"""The audit log: one JSON line per tool call, best effort, never content, never raw IDs.

The file is created with mode 0600 from its first byte (``os.open`` with the mode) in a 0700
directory. A failed write produces one generic warning on stderr and never fails or hides a call's result.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

logger = logging.getLogger(__name__)

AuditValue = int | bool | str | None


def default_audit_path() -> Path:
    """``%LOCALAPPDATA%\\code-sandbox\\audit.jsonl`` on Windows, else ``$XDG_STATE_HOME`` or ``~/.local/state``."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        state = os.environ.get("XDG_STATE_HOME")
        base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "code-sandbox" / "audit.jsonl"


class AuditLog:
    """Appends audit records from a background writer thread, so a slow disk never delays a call.

    Disabled instances do nothing. :meth:`close` writes what is queued (bounded in time).
    """

    def __init__(self, path: Path | None, *, enabled: bool) -> None:
        self.path = path or default_audit_path()
        self.enabled = enabled
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._warned = False

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
            self._writer = threading.Thread(target=self._write_queued, name="code-sandbox audit", daemon=True)
            self._writer.start()
        self._queue.put(line + "\n")

    def close(self, timeout: float = 2.0) -> None:
        """Write every queued record, waiting at most ``timeout`` seconds."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout)
            self._writer = None

    def _write_queued(self) -> None:
        while (line := self._queue.get()) is not None:
            try:
                self._append(line)
            except OSError:
                if not self._warned:
                    self._warned = True
                    logger.warning("the audit log could not be written; calls continue without it")

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The mode is applied at creation, so the file is never readable by others, not even for a moment.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as stream:
            stream.write(line)
