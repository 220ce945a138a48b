"""Start-up milestones of a server, for an operator who asks (``serve --verbose``) and for ``bench/run.py``'s cold
timeline: each is logged once, at INFO, with the system's monotonic clock (the same in every process of the machine,
so a client that noted when it spawned the server can place each milestone after the spawn)."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger(__name__)

PREFIX = "start-up milestone:"
"""What every milestone line starts with: ``start-up milestone: <name> at monotonic <seconds>``."""

_seen: set[str] = set()
_lock = threading.Lock()


def milestone(name: str) -> None:
    """Log ``name`` with the time now, the first time only (later calls of the same name say nothing)."""
    if name in _seen:  # every later call, on paths as hot as a tool call: no clock, no lock
        return
    now = time.monotonic()
    with _lock:
        if name in _seen:
            return
        _seen.add(name)
    logger.info("%s %s at monotonic %.6f", PREFIX, name, now)
