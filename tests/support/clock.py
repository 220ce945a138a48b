"""A monotonic clock that tests move by hand, for the expiry, idle and pool logic (``SessionManager(clock=...)``)."""

from __future__ import annotations


class FakeClock:
    """Stands in for ``time.monotonic``: time passes only when a test advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
