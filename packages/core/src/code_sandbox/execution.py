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
import binascii
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SUPERVISOR_USER
from code_sandbox.helpers import HelperCrash, call_helper
from code_sandbox.paths import validate_entrypoint
from code_sandbox.protocol import (
    KillAllAnswer,
    OutputPiece,
    ProtocolViolation,
    Refusal,
    RunAnswer,
    SurveyAnswer,
    parse_message,
)
from code_sandbox.protocol import Progress as ProgressLine
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
SURVEY_TIMEOUT_SECONDS = 10.0
UPDATES_PER_SECOND = 4.0
"""How many of the runner's stderr lines (progress, streamed output) the host parses and forwards per second."""
UPDATE_BURST = 8

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

        def call(on_stderr: Callable[[bytes], None] | None) -> RunAnswer | Refusal:
            try:
                return call_helper(
                    manager.engine,
                    session.container_id,
                    runner_argv,
                    user=session.user,
                    answer=RunAnswer,
                    request=request,
                    timeout=timeout + HOST_GRACE_SECONDS,
                    max_answer=8 * MiB,
                    max_stderr=8 * MiB,  # progress lines, and streamed output when asked for
                    on_stderr=on_stderr,
                )
            finally:
                finished.set()

        survey = Survey(manager, session, timeout=timeout + HOST_GRACE_SECONDS + SURVEY_TIMEOUT_SECONDS)
        try:
            return await _run_and_verify(manager, session, call, survey, progress, output, finished)
        finally:
            survey.cancel()


async def _run_and_verify(
    manager: SessionManager,
    session: Session,
    call: Callable[[Callable[[bytes], None] | None], RunAnswer | Refusal],
    survey: Survey,
    progress: Progress | None,
    output: OutputSink | None,
    finished: threading.Event,
) -> RunResult:
    try:
        answer = await _supervise(call, progress, output)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await cancel_run(manager, session, finished)
        raise
    except HelperCrash:
        raise await manager.fail_closed_with(
            session,
            SandboxError(
                ErrorCode.SUPERVISOR_FAILED,
                "the run's supervisor was stopped or answered out of protocol; the sandbox was destroyed",
            ),
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
    result = await _result(manager, session, answer)
    await require_no_survivors(manager, session, survey)
    return result


async def _supervise(
    call: Callable[[Callable[[bytes], None] | None], RunAnswer | Refusal],
    progress: Progress | None,
    output: OutputSink | None,
) -> RunAnswer | Refusal | None:
    """Run the blocking runner call in a worker thread, relaying progress beside it.

    The call's outcome is carried out of the task group by hand, so an error or a cancellation leaves as itself
    rather than wrapped in an exception group.
    """
    outcome: RunAnswer | Refusal | None = None
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


async def _result(manager: SessionManager, session: Session, answer: RunAnswer | Refusal | None) -> RunResult:
    if not isinstance(answer, RunAnswer):  # a refusal: the runner could not start the program
        await manager.fail_closed(session)
        raise SandboxError(ErrorCode.SUPERVISOR_FAILED, "the program could not be started; the sandbox was destroyed")
    try:
        stdout = _decode_output(answer.stdout_b64, answer.stdout_bytes, answer.stdout_truncated)
        stderr = _decode_output(answer.stderr_b64, answer.stderr_bytes, answer.stderr_truncated)
    except ProtocolViolation:
        await manager.fail_closed(session)
        raise SandboxError(
            ErrorCode.SUPERVISOR_FAILED, "the run's supervisor answered out of protocol; the sandbox was destroyed"
        ) from None
    if answer.cleanup != "ok":
        await manager.fail_closed(session)
        raise _cleanup_failed()
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


def _decode_output(b64: str, total: int, truncated: bool) -> bytes:
    """The kept bytes of one stream, checked against the counts the runner reported with them."""
    try:
        kept = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolViolation("output") from None
    consistent = len(kept) <= OUTPUT_CAP_BYTES and len(kept) <= total and truncated == (total > OUTPUT_CAP_BYTES)
    if not consistent or (not truncated and len(kept) != total):
        raise ProtocolViolation("output")
    return kept


def _cleanup_failed() -> SandboxError:
    return SandboxError(
        ErrorCode.PROCESS_CLEANUP_FAILED,
        "processes the program left behind could not be stopped; the sandbox was destroyed",
    )


class Survey:
    """The supervisor's count of processes that outlived a run, started early so that its start-up is not paid
    after the run.

    ``runner --survey`` runs as the supervisor uid, which user code can neither signal nor read; it waits for one
    byte on stdin and then counts every live process of any other unprivileged uid in the container. Started
    beside a run, it costs the run only that byte and the scan. Without the byte (:meth:`cancel`) it ends unheard.
    """

    def __init__(self, manager: SessionManager, session: Session, *, timeout: float) -> None:
        self._gate = threading.Event()
        self._go = False
        self._answer: SurveyAnswer | Refusal | None = None
        self._call = partial(
            call_helper,
            manager.engine,
            session.container_id,
            [*manager.profile.helper_argv("runner"), "--survey"],
            user=SUPERVISOR_USER,
            answer=SurveyAnswer,
            stdin=self._stdin(),
            timeout=timeout,
        )
        self._thread = threading.Thread(target=self._work, name="code-sandbox survey", daemon=True)
        self._thread.start()

    def _stdin(self) -> Iterator[bytes]:
        self._gate.wait()
        if self._go:
            yield b"\n"

    def _work(self) -> None:
        try:
            self._answer = self._call()
        except Exception:  # any failure leaves no answer, which counts as "not proven"
            self._answer = None

    async def count(self) -> int | None:
        """Let the survey scan now (the run is over) and return how many processes outlived it, or ``None``."""
        self._go = True
        self._gate.set()
        await anyio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
        answer = self._answer
        return answer.alive if isinstance(answer, SurveyAnswer) else None

    def cancel(self) -> None:
        """End a survey that will not be needed (the run failed); harmless after :meth:`count`."""
        self._gate.set()


async def require_no_survivors(manager: SessionManager, session: Session, survey: Survey) -> None:
    """Destroy the sandbox (``PROCESS_CLEANUP_FAILED``) unless the survey proves that nothing outlived the run."""
    if await survey.count() != 0:
        logger.warning("session %s: processes outlived their run, or the survey failed", session.hash)
        raise await manager.fail_closed_with(session, _cleanup_failed())


async def verify_cleanup(manager: SessionManager, session: Session) -> None:
    """Prove now that no process of the sandbox user is left, or destroy the sandbox."""
    await require_no_survivors(manager, session, Survey(manager, session, timeout=SURVEY_TIMEOUT_SECONDS))


async def cancel_run(manager: SessionManager, session: Session, finished: threading.Event) -> None:
    """Kill every process of the sandbox user at once and wait for the abandoned run call to end.

    The kill is repeated while the call lingers: a cancel that lands while the runner is still being started
    must not let it start afterwards and run unsupervised. If the call does not end, or the kill cannot be
    verified by the supervisor's survey, the sandbox is destroyed.
    """
    argv = [*manager.profile.helper_argv("runner"), "--kill-all"]
    kill_all = partial(
        call_helper,
        manager.engine,
        session.container_id,
        argv,
        user=session.user,
        answer=KillAllAnswer,
        timeout=CANCEL_TIMEOUT_SECONDS,
    )
    for _attempt in range(CANCEL_KILL_ATTEMPTS):
        try:
            answer = await anyio.to_thread.run_sync(kill_all, abandon_on_cancel=True)
        except SandboxError:
            break
        if not (isinstance(answer, KillAllAnswer) and answer.cleanup == "ok"):
            break
        # A threading.Event set by a worker thread: polled, because anyio.Event cannot be set from that thread
        # once the waiting task has been cancelled.
        with anyio.move_on_after(CANCEL_WAIT_SECONDS):
            while not finished.is_set():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        if finished.is_set():
            try:
                await verify_cleanup(manager, session)
            except SandboxError:
                return  # destroyed by verify_cleanup
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


class UpdateBudget:
    """A token bucket: at most ``rate`` lines a second (``burst`` at once) are parsed; the rest are dropped."""

    def __init__(
        self, rate: float = UPDATES_PER_SECOND, burst: int = UPDATE_BURST, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self.dropped = 0

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.dropped += 1
        return False


def _update_reader(
    send: MemoryObjectSendStream[_Update], budget: UpdateBudget | None = None
) -> Callable[[bytes], None]:
    """Turn the runner's stderr lines (progress, streamed output) into updates for the event loop.

    Only as many lines as the budget allows are parsed; each one parsed must be a progress line or an output
    piece, exactly, or the reader raises and the run ends as a supervisor failure. The exec thread never blocks
    on a slow consumer: it offers each update and drops it when the buffer is full, so a slow client can delay
    updates but never the run or its deadline. A stream that lost a piece (to the budget or to a full buffer) is
    not continued (no gaps); its remainder comes from the result.
    """
    budget = budget or UpdateBudget()
    pending = bytearray()
    behind: set[str] = set()

    def offer(update: _Update) -> bool:
        try:
            send.send_nowait(update)
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        return True

    def forward(update: _Update) -> bool:
        try:
            return anyio.from_thread.run_sync(offer, update)
        except RuntimeError:  # the event loop is gone, so nobody wants updates any more
            return False

    def handle(line: bytes) -> None:
        if line.startswith(b'{"stream"'):
            piece = parse_message(line, OutputPiece)
            if piece.stream in behind:
                return
            try:
                data = base64.b64decode(piece.b64, validate=True)
            except (binascii.Error, ValueError):
                raise ProtocolViolation("output piece") from None
            if not forward((piece.stream, data)):
                behind.add(piece.stream)
            return
        line_progress = parse_message(line, ProgressLine)
        forward((line_progress.elapsed_ms / 1000, line_progress.stdout_bytes + line_progress.stderr_bytes))

    def on_stderr(chunk: bytes) -> None:
        pending.extend(chunk)
        start = 0
        while (end := pending.find(b"\n", start)) != -1:
            if budget.take():
                handle(bytes(pending[start:end]))
            elif pending.startswith(b'{"stream"', start):
                behind.add("stdout" if pending.startswith(b'{"stream":"stdout"', start) else "stderr")
            start = end + 1
        del pending[:start]

    return on_stderr
