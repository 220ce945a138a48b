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
import json
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread

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

Progress = Callable[[float, int], Coroutine[Any, Any, None]]
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


def validate_arguments(arguments: Sequence[str]) -> list[str]:
    if len(arguments) > MAX_ARGUMENTS:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"at most {MAX_ARGUMENTS} arguments are allowed")
    for argument in arguments:
        if "\x00" in argument:
            raise SandboxError(ErrorCode.INVALID_REQUEST, "arguments must not contain NUL characters")
        if len(argument.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            raise SandboxError(ErrorCode.INVALID_REQUEST, f"each argument is at most {MAX_ARGUMENT_BYTES} bytes")
    return list(arguments)


async def run_entrypoint(
    manager: SessionManager,
    session_id: str,
    entrypoint: str,
    arguments: Sequence[str],
    *,
    timeout_seconds: int | None,
    progress: Progress | None = None,
) -> RunResult:
    """Run ``entrypoint`` with ``arguments`` in the sandbox and return how it ended."""
    settings = manager.settings
    timeout = settings.default_timeout if timeout_seconds is None else timeout_seconds
    if not 1 <= timeout <= settings.max_timeout:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"timeout_seconds must be from 1 to {settings.max_timeout}")
    path = validate_entrypoint(entrypoint, manager.profile.info.entrypoint_suffixes)
    argv = manager.profile.build_run_argv(path, validate_arguments(arguments))
    request = {
        "argv": argv,
        "timeout_ms": timeout * 1000,
        "stdout_cap": OUTPUT_CAP_BYTES,
        "stderr_cap": OUTPUT_CAP_BYTES,
    }
    runner_argv = [*manager.profile.helper_argv("runner"), json.dumps(request)]
    async with manager.lease(session_id) as session:
        on_stderr = _progress_relay(progress) if progress is not None else None

        def call() -> dict[str, Any]:
            return call_helper(
                manager.engine,
                session.container_id,
                runner_argv,
                timeout=timeout + HOST_GRACE_SECONDS,
                max_answer=8 * MiB,
                on_stderr=on_stderr,
            )

        try:
            answer = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await cancel_run(manager, session)
            raise
        except HelperCrash:
            await manager.fail_closed(session)
            raise SandboxError(
                ErrorCode.INTERNAL_ERROR, "the run could not be supervised; the sandbox was destroyed"
            ) from None
        except SandboxError as error:
            if error.code == ErrorCode.TIMEOUT:
                await manager.fail_closed(session)
                raise SandboxError(
                    ErrorCode.TIMEOUT, "the run did not stop at its deadline; the sandbox was destroyed"
                ) from None
            raise
        return await _result(manager, session, answer)


async def _result(manager: SessionManager, session: Session, answer: dict[str, Any]) -> RunResult:
    if not answer["ok"]:
        await manager.fail_closed(session)
        raise SandboxError(ErrorCode.INTERNAL_ERROR, "the program could not be started; the sandbox was destroyed")
    if answer.get("cleanup") != "ok":
        await manager.fail_closed(session)
        raise SandboxError(
            ErrorCode.PROCESS_CLEANUP_FAILED,
            "processes the program left behind could not be stopped; the sandbox was destroyed",
        )
    stdout = base64.b64decode(answer["stdout_b64"])
    stderr = base64.b64decode(answer["stderr_b64"])
    truncated_out, truncated_err = bool(answer["stdout_truncated"]), bool(answer["stderr_truncated"])
    signal = answer.get("signal")
    reason: TerminationReason
    if truncated_out or truncated_err:
        reason = "OUTPUT_LIMIT_EXCEEDED"
    elif answer["timed_out"]:
        reason = "timed_out"
    elif answer["oom_killed"]:
        reason = "oom_killed"
    elif signal:
        reason = "signaled"
    else:
        reason = "exited"
    return RunResult(
        exit_code=answer.get("exit_code"),
        signal=str(signal) if signal else None,
        timed_out=bool(answer["timed_out"]),
        oom_killed=bool(answer["oom_killed"]),
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        stdout_truncated=truncated_out,
        stderr_truncated=truncated_err,
        termination_reason=reason,
        duration_ms=int(answer["duration_ms"]),
        output_bytes=int(answer["stdout_bytes"]) + int(answer["stderr_bytes"]),
        leftover_processes_killed=int(answer.get("leftover_killed", 0)),
    )


async def cancel_run(manager: SessionManager, session: Session) -> None:
    """Kill every process of the sandbox user at once; destroy the sandbox if that cannot be verified."""
    argv = [*manager.profile.helper_argv("runner"), "--kill-all"]
    try:
        answer = await anyio.to_thread.run_sync(
            lambda: call_helper(manager.engine, session.container_id, argv, timeout=CANCEL_TIMEOUT_SECONDS)
        )
        if answer.get("ok") and answer.get("cleanup") == "ok":
            logger.info("session %s: cancelled run stopped", session.hash)
            return
    except SandboxError:
        pass
    await manager.fail_closed(session)


def _progress_relay(progress: Progress) -> Callable[[bytes], None]:
    """Turn the runner's stderr progress lines (one JSON object a second) into calls on the event loop."""
    pending = bytearray()

    def on_stderr(chunk: bytes) -> None:
        pending.extend(chunk)
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            try:
                update = json.loads(line)
                elapsed = float(update["elapsed_ms"]) / 1000
                output = int(update["stdout_bytes"]) + int(update["stderr_bytes"])
            except (ValueError, KeyError, TypeError):
                continue
            try:
                anyio.from_thread.run(progress, elapsed, output)
            except Exception:  # a client that cannot take progress must not break the run
                logger.debug("a progress notification could not be sent")

    return on_stderr
