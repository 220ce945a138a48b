"""What a run and an evaluation share around their runner call: the call in a worker thread with its progress
relayed (:mod:`code_sandbox.sandbox.relay`), a crash or hang that destroys the sandbox, a cancellation that kills every
process of the sandbox user, the supervisor's survey that proves nothing outlived the call, and the output bytes
checked against the counts the runner reported.

Cancellation kills the call's processes (``runner --kill-all``) rather than destroying the sandbox: the kill is
verified by the survey, it takes a fraction of a second, and the model keeps its files. If the kill cannot be
verified, the sandbox is destroyed instead.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import anyio
import anyio.to_thread

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.protocol import KillAllAnswer, ProtocolViolation, Refusal, SurveyAnswer
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import OUTPUT_CAP_BYTES
from code_sandbox.sandbox.relay import OutputSink, Progress, supervise

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_A = TypeVar("_A")

HOST_GRACE_SECONDS = 5.0
"""How long past the run's deadline the host waits for the runner before it destroys the sandbox."""
CANCEL_TIMEOUT_SECONDS = 5.0
CANCEL_KILL_ATTEMPTS = 3
CANCEL_WAIT_SECONDS = 0.5
SURVEY_TIMEOUT_SECONDS = 10.0
SURVEY_RETRY_PAUSES = (0.0, 0.25, 1.0)
"""Before each new survey after one that could not answer: the first at once, as the run is over already."""


async def supervise_call(
    channel: Channel,
    call: Callable[[Callable[[bytes], None] | None], _A],
    check: Callable[[_A], Awaitable[_T]],
    *,
    call_seconds: float,
    progress: Progress | None,
    output: OutputSink | None,
    what: str,
) -> _T:
    """A run's (or an evaluation's) runner call from start to proof: ``call`` in a worker thread
    (:func:`_guarded_call`), its answer judged by ``check``, and then the supervisor's survey, started beside the
    call and given ``call_seconds`` (how long the call may take) and its own time, must prove that nothing the call
    started outlived it."""
    finished = threading.Event()

    def tracked(on_stderr: Callable[[bytes], None] | None) -> _A:
        try:
            return call(on_stderr)
        finally:
            finished.set()

    survey = Survey(channel, timeout=call_seconds + SURVEY_TIMEOUT_SECONDS)
    try:
        answer = await _guarded_call(channel, tracked, progress, output, finished, what=what)
        result = await check(answer)
        await require_no_survivors(channel, survey)
        return result
    finally:
        survey.cancel()


async def _guarded_call(
    channel: Channel,
    call: Callable[[Callable[[bytes], None] | None], _T],
    progress: Progress | None,
    output: OutputSink | None,
    finished: threading.Event,
    *,
    what: str,
) -> _T:
    """The runner call in a worker thread, its progress relayed: a crash or a hang destroys the sandbox, and a
    cancellation kills every process of the sandbox user (:func:`cancel_run`)."""
    crashed = SandboxError(
        ErrorCode.SUPERVISOR_FAILED,
        f"the {what}'s supervisor was stopped or answered out of protocol; the sandbox was destroyed",
    )
    hung = SandboxError(ErrorCode.TIMEOUT, f"the {what} did not stop at its deadline; the sandbox was destroyed")
    try:
        async with channel.guard(crashed=crashed, hung=hung):
            return await supervise(call, progress, output)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await cancel_run(channel, finished)
        raise


def decode_output(b64: str, total: int, truncated: bool) -> bytes:
    """The kept bytes of one stream, checked against the counts the runner reported with them."""
    try:
        kept = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolViolation("output") from None
    consistent = len(kept) <= OUTPUT_CAP_BYTES and len(kept) <= total and truncated == (total > OUTPUT_CAP_BYTES)
    if not consistent or (not truncated and len(kept) != total):
        raise ProtocolViolation("output")
    return kept


def cleanup_failed() -> SandboxError:
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

    def __init__(self, channel: Channel, *, timeout: float) -> None:
        self._gate = threading.Event()
        self._go = False
        self._answer: SurveyAnswer | Refusal | None = None
        self._call = partial(channel.transport.survey, channel.target, self._release, timeout=timeout)
        self._thread = threading.Thread(target=self._work, name="code-sandbox survey", daemon=True)
        self._thread.start()

    def _release(self) -> bool:
        self._gate.wait()
        return self._go

    def _work(self) -> None:
        try:
            self._answer = self._call()
        except Exception:  # any failure leaves no answer, which counts as "not proven"
            self._answer = None

    async def count(self) -> int | None:
        """Let the survey scan now (the run is over) and return how many processes outlived it, or ``None``."""
        self._go = True
        self._gate.set()
        with anyio.move_on_after(SURVEY_TIMEOUT_SECONDS):
            await anyio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
        answer = self._answer
        return answer.alive if isinstance(answer, SurveyAnswer) else None

    def cancel(self) -> None:
        """End a survey that will not be needed (the run failed); harmless after :meth:`count`."""
        self._gate.set()


async def require_no_survivors(channel: Channel, survey: Survey) -> None:
    """Destroy the sandbox (``PROCESS_CLEANUP_FAILED``) unless a survey proves that nothing outlived the run.

    Shielded: a cancellation must skip neither the proof nor the destroy. A survey that could not answer is asked
    again after a pause (:data:`SURVEY_RETRY_PAUSES`): one started beside a program that filled its pid limit, or
    its memory limit while the kernel still frees it, cannot start. Only a count of zero passes; any other count
    destroys the sandbox at once.
    """
    with anyio.CancelScope(shield=True):
        alive = await survey.count()
        for pause in SURVEY_RETRY_PAUSES:
            if alive is not None:
                break
            await anyio.sleep(pause)
            alive = await Survey(channel, timeout=SURVEY_TIMEOUT_SECONDS).count()
        if alive != 0:
            what = "the survey could not answer" if alive is None else f"{alive} process(es) outlived their run"
            logger.warning("sandbox %s: %s", channel.name, what)
            raise await channel.fail_closed(cleanup_failed())


async def verify_cleanup(channel: Channel) -> None:
    """Prove now that no process of the sandbox user is left, or destroy the sandbox."""
    await require_no_survivors(channel, Survey(channel, timeout=SURVEY_TIMEOUT_SECONDS))


async def cancel_run(channel: Channel, finished: threading.Event) -> None:
    """Kill every process of the sandbox user at once and wait for the abandoned run call to end.

    The kill is repeated while the call lingers: a cancel that lands while the runner is still being started
    must not let it start afterwards and run unsupervised. If the call does not end, or the kill cannot be
    verified by the supervisor's survey, the sandbox is destroyed.
    """
    kill_all = partial(channel.transport.kill_all, channel.target, timeout=CANCEL_TIMEOUT_SECONDS)
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
                await verify_cleanup(channel)
            except SandboxError:
                return  # destroyed by verify_cleanup
            logger.info("sandbox %s: cancelled run stopped", channel.name)
            return
    await channel.fail_closed(cleanup_failed())
