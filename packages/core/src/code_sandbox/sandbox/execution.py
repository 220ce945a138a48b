"""Running an entrypoint: bounded, cancellable, with an exact structured result.

The runner helper does the work inside the container (process group, output caps, deadline, leftover cleanup,
OOM detection); this module builds its request from the profile's argv hook, enforces a host-side deadline as a
safety net, relays progress, stops a cancelled run at once, and after every run has the supervisor's survey prove
that no process of the sandbox outlived it (:mod:`code_sandbox.sandbox.supervision`).

Calls on one sandbox are serialized by its lease: a second run (or file call) on a busy sandbox waits until the
first finishes, which is bounded by that run's timeout. Runs in different sandboxes proceed in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.protocol import (
    ExecuteAnswer,
    ExecuteRequest,
    ProtocolViolation,
    Refusal,
    RunAnswer,
    RunRequest,
)
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MAX_ARGUMENT_BYTES, MAX_ARGUMENTS, OUTPUT_CAP_BYTES
from code_sandbox.paths import validate_entrypoint
from code_sandbox.sandbox.answer_text import readable_output
from code_sandbox.sandbox.relay import OutputSink, Progress
from code_sandbox.sandbox.results import RunResult, TerminationReason
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.supervision import HOST_GRACE_SECONDS, cleanup_failed, decode_output, supervise_call
from code_sandbox.sandbox.workspace import PreparedWrite, check_file_reply, file_refusal_error, is_file_refusal


def validate_arguments(arguments: Sequence[str]) -> list[str]:
    if len(arguments) > MAX_ARGUMENTS:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"at most {MAX_ARGUMENTS} arguments are allowed")
    for argument in arguments:
        if "\x00" in argument:
            raise SandboxError(ErrorCode.INVALID_REQUEST, "arguments must not contain NUL characters")
        if len(argument.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES:
            raise SandboxError(ErrorCode.INVALID_REQUEST, f"each argument is at most {MAX_ARGUMENT_BYTES} bytes")
    return list(arguments)


@dataclass(frozen=True)
class Program:
    """A checked run: the entrypoint's workspace path, the argv the profile built for it, and the timeout."""

    entrypoint: str
    argv: list[str]
    timeout_seconds: int


def prepare_program(
    manager: SessionManager, entrypoint: str, arguments: Sequence[str], *, timeout_seconds: int | None
) -> Program:
    """Check a run's entrypoint, arguments and timeout before any sandbox is touched."""
    settings = manager.provisioner.settings
    timeout = settings.default_timeout if timeout_seconds is None else timeout_seconds
    if not 1 <= timeout <= settings.max_timeout:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"timeout_seconds must be from 1 to {settings.max_timeout}")
    path = validate_entrypoint(entrypoint, manager.provisioner.profile.info.entrypoint_suffixes)
    return Program(path, manager.provisioner.profile.build_run_argv(path, validate_arguments(arguments)), timeout)


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
    program = prepare_program(manager, entrypoint, arguments, timeout_seconds=timeout_seconds)
    return await run_prepared(manager, session_id, program, progress=progress, output=output)


async def run_prepared(
    manager: SessionManager,
    session_id: str,
    program: Program,
    *,
    files: PreparedWrite | None = None,
    progress: Progress | None = None,
    output: OutputSink | None = None,
) -> RunResult:
    """Run a checked program in the sandbox; with ``files``, write them first in the same request (a one-shot)."""
    async with manager.channel(session_id) as channel:
        return await run_program(
            channel, program.argv, timeout_seconds=program.timeout_seconds, files=files, progress=progress,
            output=output,
        )  # fmt: skip


async def run_program(
    channel: Channel,
    argv: list[str],
    *,
    timeout_seconds: int,
    files: PreparedWrite | None = None,
    progress: Progress | None = None,
    output: OutputSink | None = None,
) -> RunResult:
    """Run ``argv`` in a leased sandbox, then prove that nothing it started outlived it.

    With ``files`` the write and the run go as one request (:meth:`Transport.execute`): the program starts only
    once every file is written.
    """
    # Never run past the sandbox's own lifetime: its watchdog would kill the run mid-way.
    remaining = int(channel.seconds_left)
    if remaining < 1:
        raise SandboxError(ErrorCode.SESSION_EXPIRED, "this sandbox reached its lifetime; create a new one")
    timeout = min(timeout_seconds, remaining)
    request = RunRequest(
        argv=argv,
        timeout_ms=timeout * 1000,
        stdout_cap=OUTPUT_CAP_BYTES,
        stderr_cap=OUTPUT_CAP_BYTES,
        stream=output is not None,
    )
    host_timeout = timeout + HOST_GRACE_SECONDS + (files.seconds if files is not None else 0)

    def call(on_stderr: Callable[[bytes], None] | None) -> RunAnswer | ExecuteAnswer | Refusal:
        transport, target = channel.transport, channel.target
        if files is None:
            return transport.run(target, request, timeout=host_timeout, on_stderr=on_stderr)
        one_shot = ExecuteRequest(write=files.request, run=request)
        return transport.execute(target, one_shot, payload=files.payload(), timeout=host_timeout, on_stderr=on_stderr)

    async def check(answer: RunAnswer | ExecuteAnswer | Refusal) -> RunResult:
        return await _result(channel, request, await _run_half(channel, files, answer))

    return await supervise_call(channel, call, check, progress=progress, output=output, what="run")


async def _run_half(
    channel: Channel, files: PreparedWrite | None, answer: RunAnswer | ExecuteAnswer | Refusal | None
) -> RunAnswer | Refusal | None:
    """The run's answer; of a one-shot's, the run half once the write half proves every file written (a file
    helper's refusal raises as a write's would). ``None`` for an answer the call should not have had."""
    if files is None:
        return None if isinstance(answer, ExecuteAnswer) else answer
    if isinstance(answer, Refusal) and is_file_refusal(answer):
        # A one-shot's sandbox is discarded anyway, and its channel ended with the refusal: destroy it now.
        raise await channel.fail_closed(file_refusal_error(answer))
    if not isinstance(answer, ExecuteAnswer):
        return None if isinstance(answer, RunAnswer) else answer
    written = await check_file_reply(channel, answer.written, len(files.files))
    if any(status != "written" for status in written.results):
        raise await channel.fail_closed(
            SandboxError(
                ErrorCode.TRANSFER_FAILED, "the one-shot's files were not all written; the sandbox was destroyed"
            )
        )
    return answer.run


async def _result(channel: Channel, request: RunRequest, answer: RunAnswer | Refusal | None) -> RunResult:
    if not isinstance(answer, RunAnswer):  # a refusal: the runner could not start the program
        raise await channel.fail_closed(
            SandboxError(ErrorCode.SUPERVISOR_FAILED, "the program could not be started; the sandbox was destroyed")
        )
    try:
        stdout = decode_output(answer.stdout_b64, answer.stdout_bytes, answer.stdout_truncated)
        stderr = decode_output(answer.stderr_b64, answer.stderr_bytes, answer.stderr_truncated)
    except ProtocolViolation:
        raise await channel.fail_closed(
            SandboxError(
                ErrorCode.SUPERVISOR_FAILED, "the run's supervisor answered out of protocol; the sandbox was destroyed"
            )
        ) from None
    if answer.cleanup != "ok":
        raise await channel.fail_closed(cleanup_failed())
    # A run that lasted past its timeout timed out, whatever the runner says: user code shares its uid and can stop
    # or starve it across the deadline, so that it sees only the exit.
    timed_out = answer.timed_out or answer.duration_ms > request.timeout_ms
    reason: TerminationReason
    if answer.stdout_truncated or answer.stderr_truncated:
        reason = "OUTPUT_LIMIT_EXCEEDED"
    elif timed_out:
        reason = "timed_out"
    elif answer.oom_killed:
        reason = "oom_killed"
    elif answer.signal:
        reason = "signaled"
    else:
        reason = "exited"
    shown_stdout, stdout_cut = readable_output(stdout)
    shown_stderr, stderr_cut = readable_output(stderr)
    return RunResult(
        exit_code=answer.exit_code,
        signal=answer.signal or None,
        timed_out=timed_out,
        oom_killed=answer.oom_killed,
        stdout=shown_stdout,
        stderr=shown_stderr,
        stdout_raw=stdout,
        stderr_raw=stderr,
        stdout_truncated=answer.stdout_truncated or stdout_cut,
        stderr_truncated=answer.stderr_truncated or stderr_cut,
        termination_reason=reason,
        duration_ms=answer.duration_ms,
        output_bytes=answer.stdout_bytes + answer.stderr_bytes,
        leftover_processes_killed=answer.leftover_killed,
        cpu_ms=answer.cpu_ms,
        peak_memory_bytes=answer.peak_memory_bytes,
    )
