"""Running a session manager's warm pool for the length of a test block."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from functools import partial

import anyio
from code_sandbox.sandbox.pool import POOL_RETRY_SECONDS
from code_sandbox.sandbox.sessions import SessionManager


@contextlib.asynccontextmanager
async def running_pool(
    manager: SessionManager, *, retry_seconds: float = POOL_RETRY_SECONDS, filled: bool = True
) -> AsyncGenerator[SessionManager]:
    """Run the manager's pool filler while the block runs (from the moment the pool is full, with ``filled``); then
    shut the manager down."""
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(partial(manager.pool.run, retry_seconds))
            if filled:
                with anyio.fail_after(30):
                    await manager.pool.wait_for_pool()
            yield manager
            group.cancel_scope.cancel()
    finally:
        await manager.shutdown()
