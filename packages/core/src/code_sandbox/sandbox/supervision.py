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

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.protocol import KillAllAnswer, ProtocolViolation, SurveyAnswer
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import OUTPUT_CAP_BYTES
from code_sandbox.sandbox.relay import OutputSink, Progress, supervise
from code_sandbox.threads import in_engine_thread

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
CONTAINER_CHECK_SECONDS = 2.0
"""While a call is under way, how often the host asks the engine whether its container still runs: the held exec of
a removed container can stay open until the call's deadline (seen under gVisor), so its end is not waited for."""


async def supervise_call(
    channel: Channel,
    call: Callable[[Callable[[bytes], None] | None], _A],
    check: Callable[[_A], Awaitable[_T]],
    *,
    progress: Progress | None,
    output: OutputSink | None,
    what: str,
) -> _T:
    """A run's (or an evaluation's) runner call from start to proof: ``call`` in a worker thread
    (:func:`_guarded_call`), then, in the same thread as soon as the call has its answer, the supervisor's survey;
    the answer is judged by ``check``, and the survey must prove that nothing the call started outlived it."""
    finished = threading.Event()
    abandoned = threading.Event()
    counted: list[int | None] = []

    def tracked(on_stderr: Callable[[bytes], None] | None) -> _A:
        try:
            answer = call(on_stderr)
        finally:
            finished.set()
        if not abandoned.is_set():  # a cancelled call's cleanup is proven by the cancel (:func:`cancel_run`)
            counted.append(count_survivors(channel))
        return answer

    answer = await _guarded_call(channel, tracked, progress, output, finished, abandoned, what=what)
    result = await check(answer)
    await require_no_survivors(channel, counted[0] if counted else None)
    return result


async def _guarded_call(
    channel: Channel,
    call: Callable[[Callable[[bytes], None] | None], _T],
    progress: Progress | None,
    output: OutputSink | None,
    finished: threading.Event,
    abandoned: threading.Event,
    *,
    what: str,
) -> _T:
    """The runner call in a worker thread, its progress relayed: a crash or a hang destroys the sandbox, and a
    cancellation kills every process of the sandbox user (:func:`cancel_run`, which proves that cleanup itself:
    ``abandoned`` tells the call's thread not to survey)."""
    crashed = SandboxError(
        ErrorCode.SUPERVISOR_FAILED,
        f"the {what}'s supervisor was stopped or answered out of protocol; the sandbox was destroyed",
    )
    hung = SandboxError(ErrorCode.TIMEOUT, f"the {what} did not stop at its deadline; the sandbox was destroyed")
    threading.Thread(target=_watch_container, args=(channel, finished), name="container-watch", daemon=True).start()
    try:
        async with channel.guard(crashed=crashed, hung=hung):
            return await supervise(call, progress, output)
    except anyio.get_cancelled_exc_class():
        abandoned.set()
        with anyio.CancelScope(shield=True):
            await cancel_run(channel, finished)
        raise


def _watch_container(channel: Channel, finished: threading.Event) -> None:
    """Until the call has finished: once the engine says the container is gone, forget it in the transport, which
    closes its channel and so ends the call (the guard then finds the container gone: ``CONTAINER_UNAVAILABLE``)."""
    if channel.container_gone is None:
        return
    while not finished.wait(CONTAINER_CHECK_SECONDS):
        if channel.container_gone():
            logger.info("sandbox %s: its container is gone during a call", channel.name)
            channel.transport.close(channel.target.container)
            return


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


def count_survivors(channel: Channel) -> int | None:
    """The supervisor's count of processes that outlived a call, or ``None`` when it could not answer.

    The survey runs as the supervisor uid, which user code can neither signal nor read, and counts every live process
    of any other unprivileged uid in the container but those the transport names as the channel's own. It is asked
    only once the call is over (its answer is in): blocking, in the caller's thread."""
    try:
        answer = channel.transport.survey(channel.target, timeout=SURVEY_TIMEOUT_SECONDS)
    except Exception:  # any failure leaves no answer, which counts as "not proven"
        return None
    return answer.alive if isinstance(answer, SurveyAnswer) else None


async def _count_soon(channel: Channel) -> int | None:
    """:func:`count_survivors` in a worker thread, bounded by :data:`SURVEY_TIMEOUT_SECONDS`."""
    with anyio.move_on_after(SURVEY_TIMEOUT_SECONDS):
        return await in_engine_thread(count_survivors, channel, abandon=True)
    return None


async def require_no_survivors(channel: Channel, counted: int | None) -> None:
    """Destroy the sandbox (``PROCESS_CLEANUP_FAILED``) unless a survey proves that nothing outlived the run.

    ``counted`` is the first survey's count (:func:`count_survivors`). Shielded: a cancellation must skip neither the
    proof nor the destroy. A survey that could not answer is asked again after a pause (:data:`SURVEY_RETRY_PAUSES`):
    the supervisor's exec cannot start while a program fills the pid limit, or the memory limit while the kernel
    still frees it. Only a count of zero passes; any other count destroys the sandbox at once.
    """
    with anyio.CancelScope(shield=True):
        alive = counted
        for pause in SURVEY_RETRY_PAUSES:
            if alive is not None:
                break
            await anyio.sleep(pause)
            alive = await _count_soon(channel)
        if alive != 0:
            what = "the survey could not answer" if alive is None else f"{alive} process(es) outlived their run"
            logger.warning("sandbox %s: %s", channel.name, what)
            raise await channel.fail_closed(cleanup_failed())


async def verify_cleanup(channel: Channel) -> None:
    """Prove now that no process of the sandbox user is left, or destroy the sandbox."""
    with anyio.CancelScope(shield=True):  # the first count too: a cancellation must skip neither it nor the destroy
        await require_no_survivors(channel, await _count_soon(channel))


async def cancel_run(channel: Channel, finished: threading.Event) -> None:
    """Kill every process of the sandbox user at once and wait for the abandoned run call to end.

    The kill is repeated while the call lingers: a cancel that lands while the runner is still being started
    must not let it start afterwards and run unsupervised. If the call does not end, or the kill cannot be
    verified by the supervisor's survey, the sandbox is destroyed.
    """
    kill_all = partial(channel.transport.kill_all, channel.target, timeout=CANCEL_TIMEOUT_SECONDS)
    for _attempt in range(CANCEL_KILL_ATTEMPTS):
        try:
            answer = await in_engine_thread(kill_all, abandon=True)
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
