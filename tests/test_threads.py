"""Worker-thread budgets (code_sandbox.threads): long runs never take the threads that engine requests and the
protocol's writes need, and a call that finds no thread left is refused at once."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.workspace import write_files
from code_sandbox.serve.handshake import RecordedAnswers
from code_sandbox.serve.stdio import Wire
from code_sandbox.threads import CALL_THREADS, limiter

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


async def test_runs_file_calls_and_the_wire_never_wait_for_a_full_default_pool(
    manager: SessionManager, tmp_path: Path
) -> None:
    # anyio's default pool of 40 threads was everything's: 40 runs sleeping 30 s froze tools/list and every other
    # sandbox's call. Here something else holds all 40; a sandbox is made, given a file and run, and a line goes to
    # the client, none of them waiting for one of those threads.
    session = await manager.create()
    held = threading.Event()
    default = anyio.to_thread.current_default_thread_limiter()
    async with anyio.create_task_group() as holders:
        for _ in range(int(default.total_tokens)):
            holders.start_soon(lambda: anyio.to_thread.run_sync(held.wait, 60, abandon_on_cancel=True))
        try:
            await anyio.wait_all_tasks_blocked()
            assert default.available_tokens == 0
            with anyio.fail_after(30):
                await write_files(manager, session.id, [("main.js", "console.log(6 * 7)")], overwrite=True)
                result = await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10)
                other = await manager.create()
                read, write = os.pipe()
                try:
                    wire = Wire(write, RecordedAnswers(tmp_path, ["test"]))
                    await wire.write('{"jsonrpc":"2.0","id":1,"result":{}}\n')
                    assert os.read(read, 4096) == b'{"jsonrpc":"2.0","id":1,"result":{}}\n'
                finally:
                    os.close(read)
                    os.close(write)
            assert (result.exit_code, result.stdout) == (0, "42\n")
            assert other.state == "active"
        finally:
            held.set()


@pytest.fixture
async def calls_held() -> AsyncIterator[list[object]]:
    """Borrowers for every thread of the call budget, filled by the test (in its event loop) and let go after."""
    borrowers: list[object] = []
    yield borrowers
    budget = limiter("calls")
    for borrower in borrowers:
        budget.release_on_behalf_of(borrower)


async def test_a_call_that_finds_no_thread_left_is_refused_at_once_and_loses_nothing(
    manager: SessionManager, calls_held: list[object]
) -> None:
    session = await manager.create()
    await write_files(manager, session.id, [("main.js", "console.log('ran')")], overwrite=False)
    budget = limiter("calls")
    assert budget.total_tokens == CALL_THREADS
    for _ in range(CALL_THREADS):
        calls_held.append(object())
        budget.acquire_on_behalf_of_nowait(calls_held[-1])
    with anyio.fail_after(2):  # at once, not after a stall
        with pytest.raises(SandboxError) as refused:
            await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10)
    assert refused.value.code == ErrorCode.SERVER_BUSY
    with pytest.raises(SandboxError) as refused:
        await write_files(manager, session.id, [("other.js", "1")], overwrite=False)
    assert refused.value.code == ErrorCode.SERVER_BUSY
    budget.release_on_behalf_of(calls_held.pop())
    result = await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10)
    assert (result.exit_code, result.stdout) == (0, "ran\n")  # the sandbox and its file are as they were
