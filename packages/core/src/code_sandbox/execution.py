"""Running an entrypoint: bounded, cancellable, with an exact structured result.

The runner helper does the work inside the container (process group, output caps, deadline, leftover cleanup,
OOM detection); this module builds its request from the profile's argv hook, enforces a host-side deadline as a
safety net, turns progress lines into callbacks, and stops a cancelled run at once.

Calls on one sandbox are serialized by its lease: a second run (or file call) on a busy sandbox waits until the
first finishes, which is bounded by that run's timeout. Runs in different sandboxes proceed in parallel.

Cancellation kills the run's processes (``runner --kill-all``) rather than destroying the sandbox: the kill is
verified inside the container, it takes a fraction of a second, and the model keeps its files. If the kill cannot
be verified, the sandbox is destroyed instead.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, ValidationError

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.helpers import HelperCrash, call_helper
from code_sandbox.paths import validate_entrypoint
from code_sandbox.sessions import Session, SessionManager

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
OUTPUT_CAP_BYTES = MiB
MAX_ARGUMENTS = 32
MAX_ARGUMENT_BYTES = 4096
HOST_GRACE_SECONDS = 5.0
"""How long past the run's deadline the host waits for the runner before it destroys the sandbox."""
CANCEL_TIMEOUT_SECONDS = 5.0
CANCEL_KILL_ATTEMPTS = 3
CANCEL_WAIT_SECONDS = 0.5

Progress = Callable[[float, int], Coroutine[Any, Any, None]]
OutputSink = Callable[[str, bytes], Coroutine[Any, Any, None]]
"""Called with ("stdout" or "stderr", bytes) as output arrives, in order; once a stream falls behind (its
buffer full), its later pieces are not sent and the caller takes the rest from the result's raw bytes."""
_Update = tuple[float, int] | tuple[str, bytes]
"""Called about once a second during a run with (elapsed seconds, output bytes so far)."""

TerminationReason = Literal["exited", "signaled", "timed_out", "OUTPUT_LIMIT_EXCEEDED", "oom_killed"]


@dataclass(frozen=True)
class RunResult:
    """How a program ended, exactly."""

    exit_code: int | None
    signal: str | None
    timed_out: bool
    oom_killed: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    termination_reason: TerminationReason
    duration_ms: int
    output_bytes: int
    leftover_processes_killed: int
    stdout_raw: bytes = b""
    stderr_raw: bytes = b""


def validate_arguments(arguments: Sequence[str]) -> list[str]:
    if len(arguments) > MAX_ARGUMENTS:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"at most {MAX_ARGUMENTS} arguments are allowed")
    for argument in arguments:
        if "\x00" in argument:
            raise SandboxError(ErrorCode.INVALID_REQUEST, "arguments must not contain NUL characters")
        if len(argument.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            raise SandboxError(ErrorCode.INVALID_REQUEST, f"each argument is at most {MAX_ARGUMENT_BYTES} bytes")
    return list(arguments)


class RunnerAnswer(BaseModel):
    """The runner's answer, checked strictly: it shares a uid with user code, so it is trusted only this far."""

    model_config = ConfigDict(extra="ignore", strict=True)

    ok: Literal[True]
    exit_code: int | None
    signal: str | None
    timed_out: bool
    stdout_b64: str
    stderr_b64: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    oom_killed: bool
    duration_ms: int
    cleanup: Literal["ok", "failed"]
    leftover_killed: int


async def run_entrypoint(
    manager: SessionManager,
    session_id: str,
    entrypoint: str,
    arguments: Sequence[str],
    *,
    timeout_seconds: int | None,
    progress: Progress | None = None,
    output: OutputSink | None = None,
) -> RunResult:
    """Run ``entrypoint`` with ``arguments`` in the sandbox and return how it ended."""
    settings = manager.settings
    timeout = settings.default_timeout if timeout_seconds is None else timeout_seconds
    if not 1 <= timeout <= settings.max_timeout:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"timeout_seconds must be from 1 to {settings.max_timeout}")
    path = validate_entrypoint(entrypoint, manager.profile.info.entrypoint_suffixes)
    argv = manager.profile.build_run_argv(path, validate_arguments(arguments))
    runner_argv = manager.profile.helper_argv("runner")
    async with manager.lease(session_id) as session:
        # Never run past the sandbox's own lifetime: its watchdog would kill the run mid-way.
        remaining = int(session.deadline - time.monotonic())
        if remaining < 1:
            raise SandboxError(ErrorCode.SESSION_EXPIRED, "this sandbox reached its lifetime; create a new one")
        timeout = min(timeout, remaining)
        request = {
            "argv": argv,
            "timeout_ms": timeout * 1000,
            "stdout_cap": OUTPUT_CAP_BYTES,
            "stderr_cap": OUTPUT_CAP_BYTES,
            "stream": output is not None,
        }
        finished = threading.Event()

        def call(on_stderr: Callable[[bytes], None] | None) -> dict[str, Any]:
            try:
                return call_helper(
                    manager.engine,
                    session.container_id,
                    runner_argv,
                    request=request,
                    timeout=timeout + HOST_GRACE_SECONDS,
                    max_answer=8 * MiB,
                    max_stderr=8 * MiB,  # progress lines, and streamed output when asked for
                    on_stderr=on_stderr,
                )
            finally:
                finished.set()

        try:
            answer = await _supervise(call, progress, output)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await cancel_run(manager, session, finished)
            raise
        except HelperCrash:
            raise await manager.fail_closed_with(
                session,
                SandboxError(ErrorCode.INTERNAL_ERROR, "the run could not be supervised; the sandbox was destroyed"),
            ) from None
        except SandboxError as error:
            if error.code == ErrorCode.TIMEOUT:
                raise await manager.fail_closed_with(
                    session,
                    SandboxError(ErrorCode.TIMEOUT, "the run did not stop at its deadline; the sandbox was destroyed"),
                ) from None
            if error.code == ErrorCode.CONTAINER_UNAVAILABLE:
                raise await manager.fail_closed_with(session, error) from None
            raise
        return await _result(manager, session, answer)


async def _supervise(
    call: Callable[[Callable[[bytes], None] | None], dict[str, Any]],
    progress: Progress | None,
    output: OutputSink | None,
) -> dict[str, Any]:
    """Run the blocking runner call in a worker thread, relaying progress beside it.

    The call's outcome is carried out of the task group by hand, so an error or a cancellation leaves as itself
    rather than wrapped in an exception group.
    """
    outcome: dict[str, Any] = {}
    failure: BaseException | None = None
    async with anyio.create_task_group() as group:
        send, receive = anyio.create_memory_object_stream[_Update](64)
        with send:
            on_stderr = None
            if progress is not None or output is not None:
                group.start_soon(_deliver_updates, receive, progress, output)
                on_stderr = _update_reader(send)
            else:
                receive.close()
            try:
                outcome = await anyio.to_thread.run_sync(call, on_stderr, abandon_on_cancel=True)
            except BaseException as exc:  # re-raised below, outside the group
                failure = exc
        group.cancel_scope.cancel()  # stop relaying progress
    if failure is not None:
        raise failure
    return outcome


async def _result(manager: SessionManager, session: Session, raw: dict[str, Any]) -> RunResult:
    if raw.get("ok") is False and raw.get("code") in ("SPAWN_FAILED", "INVALID_REQUEST", "RUNNING_AS_ROOT"):
        await manager.fail_closed(session)
        raise SandboxError(ErrorCode.INTERNAL_ERROR, "the program could not be started; the sandbox was destroyed")
    try:
        answer = RunnerAnswer.model_validate(raw)
        stdout = base64.b64decode(answer.stdout_b64, validate=True)
        stderr = base64.b64decode(answer.stderr_b64, validate=True)
    except (ValidationError, ValueError):
        await manager.fail_closed(session)
        raise SandboxError(
            ErrorCode.INTERNAL_ERROR, "the run's supervisor answered out of protocol; the sandbox was destroyed"
        ) from None
    if answer.cleanup != "ok":
        await manager.fail_closed(session)
        raise SandboxError(
            ErrorCode.PROCESS_CLEANUP_FAILED,
            "processes the program left behind could not be stopped; the sandbox was destroyed",
        )
    reason: TerminationReason
    if answer.stdout_truncated or answer.stderr_truncated:
        reason = "OUTPUT_LIMIT_EXCEEDED"
    elif answer.timed_out:
        reason = "timed_out"
    elif answer.oom_killed:
        reason = "oom_killed"
    elif answer.signal:
        reason = "signaled"
    else:
        reason = "exited"
    return RunResult(
        exit_code=answer.exit_code,
        signal=answer.signal or None,
        timed_out=answer.timed_out,
        oom_killed=answer.oom_killed,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        stdout_raw=stdout,
        stderr_raw=stderr,
        stdout_truncated=answer.stdout_truncated,
        stderr_truncated=answer.stderr_truncated,
        termination_reason=reason,
        duration_ms=answer.duration_ms,
        output_bytes=answer.stdout_bytes + answer.stderr_bytes,
        leftover_processes_killed=answer.leftover_killed,
    )


async def cancel_run(manager: SessionManager, session: Session, finished: threading.Event) -> None:
    """Kill every process of the sandbox user at once and wait for the abandoned run call to end.

    The kill is repeated while the call lingers: a cancel that lands while the runner is still being started
    must not let it start afterwards and run unsupervised. If the call does not end, or a kill cannot be
    verified, the sandbox is destroyed.
    """
    argv = [*manager.profile.helper_argv("runner"), "--kill-all"]
    for _attempt in range(CANCEL_KILL_ATTEMPTS):
        try:
            answer = await anyio.to_thread.run_sync(
                lambda: call_helper(manager.engine, session.container_id, argv, timeout=CANCEL_TIMEOUT_SECONDS),
                abandon_on_cancel=True,
            )
        except SandboxError:
            break
        if not (answer.get("ok") and answer.get("cleanup") == "ok"):
            break
        # A threading.Event set by a worker thread: polled, because anyio.Event cannot be set from that thread
        # once the waiting task has been cancelled.
        with anyio.move_on_after(CANCEL_WAIT_SECONDS):
            while not finished.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        if finished.is_set():
            logger.info("session %s: cancelled run stopped", session.hash)
            return
    await manager.fail_closed(session)


async def _deliver_updates(
    receive: MemoryObjectReceiveStream[_Update], progress: Progress | None, output: OutputSink | None
) -> None:
    async with receive:
        async for first, second in receive:
            try:
                if isinstance(first, str) and isinstance(second, bytes):
                    if output is not None:
                        await output(first, second)
                elif progress is not None and isinstance(first, float) and isinstance(second, int):
                    await progress(first, second)
            except Exception:  # a client that cannot take an update must not break the run
                logger.debug("a progress or output update could not be delivered")


def _update_reader(send: MemoryObjectSendStream[_Update]) -> Callable[[bytes], None]:
    """Turn the runner's stderr lines (progress, streamed output) into updates for the event loop.

    The exec thread never blocks on a slow consumer: it offers each update and drops it when the buffer is full,
    so a slow client can delay updates but never the run or its deadline. A stream that lost a piece is not
    continued (no gaps); its remainder comes from the result.
    """
    pending = bytearray()
    behind: set[str] = set()

    def offer(update: _Update) -> bool:
        try:
            send.send_nowait(update)
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    def handle(update: dict[str, Any]) -> None:
        if "stream" in update:
            name = str(update["stream"])
            if name in behind:
                return
            if not anyio.from_thread.run_sync(offer, (name, base64.b64decode(update["b64"], validate=True))):
                behind.add(name)
            return
        output = int(update["stdout_bytes"]) + int(update["stderr_bytes"])
        anyio.from_thread.run_sync(offer, (float(update["elapsed_ms"]) / 1000, output))

    def on_stderr(chunk: bytes) -> None:
        pending.extend(chunk)
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            with contextlib.suppress(ValueError, KeyError, TypeError, RuntimeError):
                # RuntimeError: the event loop is gone, so nobody wants updates any more.
                handle(json.loads(line))

    return on_stderr
