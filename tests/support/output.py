"""Output callbacks for tests that must know a program is running before they act on it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
from code_sandbox.errors import SandboxError
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.relay import OutputSink
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.workspace import write_files


def on_first_output(event: anyio.Event) -> OutputSink:
    """An output callback that sets ``event`` when the program first writes: it is running."""

    async def seen(stream: str, data: bytes) -> None:
        del stream, data
        event.set()

    return seen


async def errors_of_a_run_broken_by(
    sandboxes: SessionManager, session_id: str, fault: Callable[[], Awaitable[None]]
) -> tuple[list[SandboxError], float]:
    """Start a run that writes a line and then waits 30 s, and once it is under way await ``fault()``: the errors the
    run ended with, and the seconds from its start to its end."""
    await write_files(
        sandboxes, session_id, [("slow.js", "console.log('up'); setTimeout(() => {}, 30000)")], overwrite=True
    )
    running = anyio.Event()
    errors: list[SandboxError] = []

    async def doomed_run() -> None:
        try:
            await run_entrypoint(
                sandboxes, session_id, "slow.js", [], timeout_seconds=30, output=on_first_output(running)
            )
        except SandboxError as error:
            errors.append(error)

    started = time.monotonic()
    async with anyio.create_task_group() as group:
        group.start_soon(doomed_run)
        with anyio.fail_after(30):
            await running.wait()
        await fault()
    return errors, time.monotonic() - started
