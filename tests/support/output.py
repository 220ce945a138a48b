"""Output callbacks for tests that must know a program is running before they act on it."""

from __future__ import annotations

import anyio
from code_sandbox.relay import OutputSink


def on_first_output(event: anyio.Event) -> OutputSink:
    """An output callback that sets ``event`` when the program first writes: it is running."""

    async def seen(stream: str, data: bytes) -> None:
        del stream, data
        event.set()

    return seen
