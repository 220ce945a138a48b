"""Evaluating code in a sandbox's evaluation context: a process of user code that keeps its variables between calls.

The runner starts the context on the first call (or after it ended, or on ``reset``), sends it the code, collects
the call's output with a run's caps and deadline, and pauses the context after the call; everything else the code
started is killed, and the supervisor's survey proves it, sparing only the channel and the paused context. A
timeout, an output-cap overflow, an out-of-memory kill or a crash ends the context: the result says so and the
next call starts a fresh one. A run's cleanup ends it too. The context is user code, so what it says (a value, an
error) is user output: bounded, and never trusted for anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.protocol import EvaluateAnswer, EvaluateRequest, ProtocolViolation, Refusal
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import OUTPUT_CAP_BYTES
from code_sandbox.sandbox.answer_text import readable_output
from code_sandbox.sandbox.provisioner import run_sync
from code_sandbox.sandbox.relay import OutputSink, Progress
from code_sandbox.sandbox.results import Evaluation, ThrownErrorOutput
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.supervision import HOST_GRACE_SECONDS, cleanup_failed, decode_output, supervise_call

EVALUATION_NOT_SUPPORTED = (
    "evaluation is not available where sandboxes run under gVisor: a context would be a process of the sandbox that "
    "lives between calls, which its trust model does not allow; write a file and run it instead"
)


async def evaluate_code(
    manager: SessionManager,
    session_id: str,
    code: str,
    *,
    timeout_seconds: int | None,
    reset: bool,
    progress: Progress | None = None,
    output: OutputSink | None = None,
) -> Evaluation:
    """Evaluate ``code`` in the session's context and prove that nothing but the paused context outlived it."""
    settings = manager.provisioner.settings
    timeout = settings.default_timeout if timeout_seconds is None else timeout_seconds
    if not 1 <= timeout <= settings.max_timeout:
        raise SandboxError(ErrorCode.INVALID_REQUEST, f"timeout_seconds must be from 1 to {settings.max_timeout}")
    if not await run_sync(manager.provisioner.transport.supports_evaluation):
        raise SandboxError(ErrorCode.NOT_SUPPORTED, EVALUATION_NOT_SUPPORTED)
    async with manager.channel(session_id) as channel:
        remaining = int(channel.seconds_left)
        if remaining < 1:
            raise SandboxError(ErrorCode.SESSION_EXPIRED, "this sandbox reached its lifetime; create a new one")
        request = EvaluateRequest(
            code=code,
            timeout_ms=min(timeout, remaining) * 1000,
            stdout_cap=OUTPUT_CAP_BYTES,
            stderr_cap=OUTPUT_CAP_BYTES,
            reset=reset,
            stream=output is not None,
        )
        return await _evaluate(channel, request, progress, output)


async def _evaluate(
    channel: Channel, request: EvaluateRequest, progress: Progress | None, output: OutputSink | None
) -> Evaluation:
    host_timeout = request.timeout_ms / 1000 + HOST_GRACE_SECONDS

    def call(on_stderr: Callable[[bytes], None] | None) -> EvaluateAnswer | Refusal:
        return channel.transport.evaluate(channel.target, request, timeout=host_timeout, on_stderr=on_stderr)

    check = partial(_result, channel)
    return await supervise_call(channel, call, check, progress=progress, output=output, what="evaluation")


async def _result(channel: Channel, answer: EvaluateAnswer | Refusal) -> Evaluation:
    """The answer, checked. The context's own clock decides a timeout: an answer that came late still holds the
    value the code computed, in a context that lives on."""
    if not isinstance(answer, EvaluateAnswer):  # the context could not be started
        raise await channel.fail_closed(
            SandboxError(ErrorCode.SUPERVISOR_FAILED, "the evaluation could not be started; the sandbox was destroyed")
        )
    try:
        stdout = decode_output(answer.stdout_b64, answer.stdout_bytes, answer.stdout_truncated)
        stderr = decode_output(answer.stderr_b64, answer.stderr_bytes, answer.stderr_truncated)
        lives = answer.context_pid is not None
        if lives != (answer.context_started is not None):
            raise ProtocolViolation("evaluation")
        # A living context answered with exactly one of a value and an error; an ended one with neither, and why.
        if lives != (answer.context_ended is None) or lives != ((answer.value is None) != (answer.error is None)):
            raise ProtocolViolation("evaluation")
        if not lives and (answer.value is not None or answer.error is not None):
            raise ProtocolViolation("evaluation")
    except ProtocolViolation:
        raise await channel.fail_closed(
            SandboxError(
                ErrorCode.SUPERVISOR_FAILED,
                "the evaluation's supervisor answered out of protocol; the sandbox was destroyed",
            )
        ) from None
    if answer.cleanup != "ok":
        raise await channel.fail_closed(cleanup_failed())
    error = answer.error
    shown_stdout, stdout_cut = readable_output(stdout)
    shown_stderr, stderr_cut = readable_output(stderr)
    return Evaluation(
        value=answer.value,
        error=None if error is None else ThrownErrorOutput(name=error.name, message=error.message, stack=error.stack),
        stdout=shown_stdout,
        stderr=shown_stderr,
        stdout_truncated=answer.stdout_truncated or stdout_cut,
        stderr_truncated=answer.stderr_truncated or stderr_cut,
        context_reset=answer.context_reset,
        context_ended=answer.context_ended,
        timed_out=answer.context_ended == "timed_out",
        oom_killed=answer.context_ended == "oom_killed",
        duration_ms=answer.duration_ms,
        output_bytes=answer.stdout_bytes + answer.stderr_bytes,
        cpu_ms=answer.cpu_ms,
        peak_memory_bytes=answer.peak_memory_bytes,
    )
