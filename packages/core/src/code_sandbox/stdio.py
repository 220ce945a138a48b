"""The stdio transport of ``code-sandbox serve``: stdin's lines read on a daemon thread, SIGTERM and SIGINT, and
running the server until stdin closes."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncGenerator
from typing import Any, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp.server.stdio import stdio_server

from code_sandbox.profile import Profile
from code_sandbox.server import SandboxServer
from code_sandbox.settings import Settings

logger = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest JSON-RPC line read from the client; 100 files of 2 MiB, escaped, fit well within it."""


class StdinLines:
    """stdin's lines, read on a daemon thread.

    The SDK reads stdin in a worker thread that a cancellation must wait for, so SIGTERM could not stop a server
    whose client sends nothing. A daemon thread feeding a memory stream can be abandoned at once.
    """

    async def __aiter__(self) -> AsyncGenerator[str]:
        send, receive = anyio.create_memory_object_stream[str](1)
        token = anyio.lowlevel.current_token()

        def pump() -> None:
            # Raw os.read on a duplicate of fd 0: no Python-level buffer lock that a daemon thread could still
            # hold when the interpreter shuts down.
            fd = os.dup(0)
            parts: list[bytes] = []  # the current line so far; each chunk is scanned once, never re-copied
            size, oversized = 0, False
            try:
                while chunk := os.read(fd, 65536):
                    *complete, rest = chunk.split(b"\n")
                    for piece in complete:
                        if oversized or size + len(piece) > MAX_MESSAGE_BYTES:
                            logger.warning("dropped a client message larger than %d MiB", MAX_MESSAGE_BYTES >> 20)
                        else:
                            line = b"".join([*parts, piece]).decode("utf-8", "replace")
                            anyio.from_thread.run(send.send, line, token=token)
                        parts, size, oversized = [], 0, False
                    size += len(rest)
                    if size > MAX_MESSAGE_BYTES:
                        parts, oversized = [], True
                    elif not oversized:
                        parts.append(rest)
                tail = b"".join(parts)
                if tail.strip() and not oversized:
                    anyio.from_thread.run(send.send, tail.decode("utf-8", "replace"), token=token)
                anyio.from_thread.run_sync(send.close, token=token)
            except Exception:  # the loop is gone or the stream closed: nothing is waiting for more lines
                return
            finally:
                os.close(fd)

        threading.Thread(target=pump, name="code-sandbox stdin", daemon=True).start()
        async with receive:
            async for line in receive:
                yield line


def run_stdio_server(settings: Settings, profile: Profile) -> None:
    """Serve MCP over stdin/stdout until stdin closes or SIGTERM/SIGINT arrives; then remove every sandbox."""
    server = SandboxServer(settings, profile)

    async def serve() -> None:
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _signum in signals:
                        group.cancel_scope.cancel()
                        return

            if sys.platform != "win32":  # Windows' event loop has no signal handlers; stdin EOF still ends it
                group.start_soon(stop_on_signal)
            async with stdio_server(stdin=cast(Any, StdinLines())) as (read, write):
                await server.run(read, write, server.create_initialization_options())
            group.cancel_scope.cancel()

    try:
        anyio.run(serve)
    finally:
        server.engine.close()
