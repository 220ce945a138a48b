"""Relaying a run's progress and streamed output from the runner's stderr to the caller, strictly and at a bounded
rate, beside the blocking runner call.

The runner shares a uid with user code, so each line it writes to stderr is parsed with a strict model, and only
a few lines a second at that: the rest are dropped unparsed, so a flood costs the host almost nothing.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from code_sandbox.channel.protocol import OutputPiece, ProtocolViolation, parse_message
from code_sandbox.channel.protocol import Progress as ProgressLine
from code_sandbox.threads import in_call_thread

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

PROGRESS_PER_SECOND = 2.0
"""How many progress lines the host parses and forwards per second (the runner writes one a second)."""
PROGRESS_BURST = 4
PIECES_PER_SECOND = 10.0
"""How many output pieces the host parses and forwards per second (the runner coalesces output into at most one
piece per stream per 250 ms, or per 64 KiB, so that all kept output fits in a burst)."""
PIECE_BURST = 40
DRAIN_SECONDS = 0.5
"""How long a finished call waits for the updates it offered to reach a slow client before its answer goes out."""

Progress = Callable[[float, int], Awaitable[None]]
"""Called about once a second during a run with (elapsed seconds, output bytes so far)."""
OutputSink = Callable[[str, bytes], Awaitable[None]]
"""Called with ("stdout" or "stderr", bytes) as output arrives, in order; once a stream falls behind (a piece
dropped), its later pieces are not sent and the caller takes the rest from the result's raw bytes."""
_Update = tuple[float, int] | tuple[str, bytes]


async def supervise(
    call: Callable[[Callable[[bytes], None] | None], _T], progress: Progress | None, output: OutputSink | None
) -> _T:
    """Run the blocking runner call in a worker thread, relaying progress beside it.

    The call's outcome is carried out of the task group by hand, so an error or a cancellation leaves as itself
    rather than wrapped in an exception group.
    """
    if progress is None and output is None:  # nothing to relay
        return await in_call_thread(call, None)
    outcome: list[_T] = []
    failure: BaseException | None = None
    delivered = anyio.Event()
    async with anyio.create_task_group() as group:
        send, receive = anyio.create_memory_object_stream[_Update](64)
        with send:
            group.start_soon(_deliver_updates, receive, progress, output, delivered)
            on_stderr = update_reader(send)
            try:
                outcome.append(await in_call_thread(call, on_stderr))
            except BaseException as exc:  # re-raised below, outside the group
                failure = exc
        if failure is None:  # what was offered before the answer goes out first, unless the client is slow
            with anyio.move_on_after(DRAIN_SECONDS):
                await delivered.wait()
        group.cancel_scope.cancel()  # stop relaying progress
    if failure is not None:
        raise failure
    return outcome[0]


async def _deliver_updates(
    receive: MemoryObjectReceiveStream[_Update],
    progress: Progress | None,
    output: OutputSink | None,
    delivered: anyio.Event,
) -> None:
    try:
        await _deliver(receive, progress, output)
    finally:
        delivered.set()


async def _deliver(
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

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
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


def update_reader(
    send: MemoryObjectSendStream[_Update], clock: Callable[[], float] = time.monotonic
) -> Callable[[bytes], None]:
    """Turn the runner's stderr lines (progress, streamed output) into updates for the event loop. Call it in the
    event loop; feed it from any thread, one at a time.

    Only as many lines as each kind's budget allows are parsed; each one parsed must be a progress line or an
    output piece, exactly, or the reader raises and the run ends as a supervisor failure. The exec thread never blocks
    on a slow consumer: it offers each update and drops it when the buffer is full, so a slow client can delay
    updates but never the run or its deadline. A stream that lost a piece (to the budget or to a full buffer) is
    not continued (no gaps); its remainder comes from the result.
    """
    # Called in the event loop: the reader may then be fed from any thread (a transport's own, not only the worker).
    token = anyio.lowlevel.current_token()
    progress_budget = UpdateBudget(PROGRESS_PER_SECOND, PROGRESS_BURST, clock)
    piece_budget = UpdateBudget(PIECES_PER_SECOND, PIECE_BURST, clock)
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
            return anyio.from_thread.run_sync(offer, update, token=token)
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
            piece = pending.startswith(b'{"stream"', start)
            if (piece_budget if piece else progress_budget).take():
                handle(bytes(pending[start:end]))
            elif piece:
                behind.add("stdout" if pending.startswith(b'{"stream":"stdout"', start) else "stderr")
            start = end + 1
        del pending[:start]

    return on_stderr


LAST_LINE_CHARS = 200
"""The most of a program's output line a progress message quotes (its end, the most recent part)."""
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp")
"""Control and format characters, and line and paragraph separators: shown as spaces, so a quoted line can neither
steer a terminal nor look like two lines."""


class LastLine:
    """The last line of output a run has written so far, for progress messages: fed as an :data:`OutputSink`.

    The line is user output shown to a client: it is decoded with replacement, stripped of control and format
    characters (no terminal escapes, no bidirectional overrides), and cut to :data:`LAST_LINE_CHARS` characters.
    """

    def __init__(self) -> None:
        self._tails = {"stdout": b"", "stderr": b""}
        self.stream: str | None = None
        self.text = ""

    async def feed(self, stream: str, data: bytes) -> None:
        tail = (self._tails.get(stream, b"") + data)[-4096:]
        self._tails[stream] = tail
        # The last line, or the last state of a line redrawn with carriage returns (a progress bar).
        line = re.split(rb"[\r\n]", tail.rstrip(b"\r\n"))[-1].decode("utf-8", "replace")
        text = "".join(" " if unicodedata.category(char) in _INVISIBLE else char for char in line).strip()
        if text:
            self.stream, self.text = stream, text[-LAST_LINE_CHARS:]
