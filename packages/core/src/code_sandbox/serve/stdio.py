"""The stdio transport of ``code-sandbox serve``: the wire, start-up order, SIGTERM and SIGINT, and running the
server until stdin closes.

Start-up is ordered for a client that launches the server and calls at once. stdin and stdout are claimed first
(fd 0 then reads the null device and fd 1 writes to stderr, so nothing but JSON-RPC can reach the wire). Then three
things happen side by side: a recorded ``initialize`` answer goes out as soon as the request arrives
(:mod:`code_sandbox.serve.handshake`), the sandbox service starts and the warm pool fills, and the MCP SDK loads on a
worker thread once Docker's client has (both loads are mostly CPU under one GIL; the service's comes first, so that
the pool fills while the SDK loads). This module imports neither at the top for that reason.

Every client line is judged before the SDK sees it, and every line written is escaped (:mod:`code_sandbox.serve.wire`).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from code_sandbox.errors import SandboxError
from code_sandbox.jsonvalue import JSONObject
from code_sandbox.liveness import default_state_dir
from code_sandbox.profile import Profile
from code_sandbox.serve import tool_text
from code_sandbox.serve.handshake import (
    MAX_ANSWER_BYTES,
    EarlyRequest,
    FrontDesk,
    RecordedAnswers,
    RequestId,
    answer_line,
    build_identity,
    parse_response,
)
from code_sandbox.serve.wire import PARSE_ERROR, Refusal, escape_text, judge_line, refusal_line
from code_sandbox.settings import Settings
from code_sandbox.threads import in_wire_thread
from code_sandbox.timeline import milestone

if TYPE_CHECKING:
    from code_sandbox.sandbox.service import SandboxService

logger = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest JSON-RPC line read from the client; 100 files of 2 MiB, escaped, fit well within it."""
_OVERSIZED = f"over {MAX_MESSAGE_BYTES >> 20} MiB"
PENDING_LINES = 16
"""The client's lines read ahead of the SDK (while it loads): past them, reading waits for the SDK."""


class StdinLines:
    """The client's lines, read from ``fd`` on a daemon thread; each line that is no message the SDK will take is
    answered through ``refuse`` in its turn and not handed on.

    The SDK reads stdin in a worker thread that a cancellation must wait for, so SIGTERM could not stop a server
    whose client sends nothing. A daemon thread feeding a memory stream can be abandoned at once.
    """

    def __init__(self, fd: int, refuse: Callable[[Refusal], Awaitable[None]]) -> None:
        self._fd = fd
        self._refuse = refuse

    async def __aiter__(self) -> AsyncGenerator[str]:
        send, receive = anyio.create_memory_object_stream[str | Refusal](1)
        token = anyio.lowlevel.current_token()
        fd = self._fd

        def pass_on(line: bytes | None) -> None:
            """Judge ``line`` (``None`` for one past the limit, of which nothing was kept) and pass it on."""
            judged = judge_line(line) if line is not None else Refusal(PARSE_ERROR, None, _OVERSIZED)
            if judged is not None:
                anyio.from_thread.run(send.send, judged, token=token)

        def pump() -> None:
            # Raw os.read: no Python-level buffer lock that a daemon thread could still hold when the interpreter
            # shuts down.
            parts: list[bytes] = []  # the current line so far; each chunk is scanned once, never re-copied
            size, oversized = 0, False
            try:
                while chunk := os.read(fd, 65536):
                    *complete, rest = chunk.split(b"\n")
                    for piece in complete:
                        if oversized or size + len(piece) > MAX_MESSAGE_BYTES:
                            pass_on(None)
                        else:
                            pass_on(b"".join([*parts, piece]))
                        parts, size, oversized = [], 0, False
                    size += len(rest)
                    if size > MAX_MESSAGE_BYTES:
                        parts, oversized = [], True
                    elif not oversized:
                        parts.append(rest)
                pass_on(None if oversized else b"".join(parts))
                anyio.from_thread.run_sync(send.close, token=token)
            except Exception:  # the loop is gone or the stream closed: nothing is waiting for more lines
                return

        threading.Thread(target=pump, name="code-sandbox stdin", daemon=True).start()
        async with receive:
            async for item in receive:
                if isinstance(item, Refusal):
                    logger.warning("answered a client line that is %s with JSON-RPC error %d", item.reason, item.code)
                    await self._refuse(item)
                else:
                    yield item


_WRITE_CHARS = 256 * 1024


LIST_CHANGED = '{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'


class Wire:
    """stdout for JSON-RPC: a private duplicate of fd 1, written by worker threads, one whole line at a time, each
    line made safe for a terminal by :func:`~code_sandbox.serve.wire.escape_line`.

    A request answered early (:mod:`code_sandbox.serve.handshake`) is watched: the SDK's own answer to it is held
    back here and compared. A request the record could not answer is watched too, and the SDK's answer recorded for
    the next start.
    """

    def __init__(self, fd: int, answers: RecordedAnswers) -> None:
        self._fd = fd
        self._answers = answers
        self._writing = threading.Lock()  # the SDK's answers and refused lines' answers come from different tasks
        self._watched: dict[RequestId, tuple[EarlyRequest, JSONObject | None]] = {}
        self.on_disagreement: Callable[[], None] = lambda: None
        """Called when the SDK did not accept an ``initialize`` answered early: the client and the SDK now disagree
        about the session, and the connection must end."""

    async def send_early(self, request: EarlyRequest, result: JSONObject) -> None:
        """Answer ``request`` now, before the SDK has loaded; its answer will be compared, not sent."""
        self._watched[request.id] = (request, result)
        await in_wire_thread(self._write_line, answer_line(request.id, result).decode())

    def record(self, request: EarlyRequest) -> None:
        """Record the SDK's answer to ``request`` when it passes through."""
        self._watched[request.id] = (request, None)

    async def write(self, text: str) -> int:
        """The SDK's stdout: called with one JSON-RPC message and its newline at a time."""
        if self._watched and len(text) <= MAX_ANSWER_BYTES:  # a larger message is no answer we record
            for request, sent in list(self._watched.values()):
                if await self._compared(text, request, sent):
                    return len(text)  # answered already
        await in_wire_thread(self._write_line, text)
        return len(text)

    async def _compared(self, text: str, request: EarlyRequest, sent: JSONObject | None) -> bool:
        """Whether ``text``, the SDK's answer to ``request`` or not, was answered early already."""
        answers, result = parse_response(text, request)
        if not answers:
            return False
        del self._watched[request.id]
        if result is not None and result != sent:
            await in_wire_thread(self._answers.put, request, result)
        if sent is None:
            return False
        if result is None and request.method == "initialize":
            logger.error("the SDK refused an initialize that was answered early; ending the connection")
            self.on_disagreement()
        elif result is None:
            logger.warning("the SDK refused a %s that was answered early", request.method)
        elif result != sent:
            logger.warning("the recorded %s answer differed from the SDK's; recorded anew", request.method)
            if request.method == "tools/list" and not request.stateless:
                await in_wire_thread(self._write_line, LIST_CHANGED)  # the client asks again
        return True

    async def refuse(self, refusal: Refusal) -> None:
        """Answer a client line that never reached the SDK."""
        await in_wire_thread(self._write_line, refusal_line(refusal))

    async def flush(self) -> None:
        """Every write went out whole already."""

    def _write_line(self, text: str) -> None:
        """One line, escaped and encoded a piece at a time: a line of several MiB is never copied whole again."""
        end = len(text) - 1 if text.endswith("\n") else len(text)
        with self._writing:
            for start in range(0, end, _WRITE_CHARS):
                self._write(escape_text(text[start : min(start + _WRITE_CHARS, end)]).encode())
            self._write(b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


def claim_stdio() -> tuple[int, int]:
    """Private duplicates of fd 0 and fd 1 for the wire; fd 0 then reads the null device and fd 1 writes to stderr,
    so that nothing else (a library's stray print, a child process) can read the client's messages or corrupt ours.
    """
    stdin, stdout = _private_copy(0), _private_copy(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr was given: stray output goes nowhere
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    return stdin, stdout


def _private_copy(fd: int) -> int:
    """A duplicate above the standard range, so that it cannot become fd 2 when the process has no stderr."""
    if sys.platform == "win32":
        return os.dup(fd)
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


def run_stdio_server(settings: Settings, profile: Profile) -> None:
    """Serve MCP over stdin/stdout until stdin closes or SIGTERM/SIGINT arrives; then remove every sandbox."""
    run_text = tool_text.run_tool_description(settings, profile)  # a profile's bad text fails before anything is said
    evaluate_text = tool_text.evaluate_tool_description(settings, profile)
    stdin_fd, stdout_fd = claim_stdio()
    milestone("stdio claimed")
    state_dir = default_state_dir()
    texts = (tool_text.instructions(settings, profile.info), run_text, evaluate_text, repr(settings))
    answers = RecordedAnswers(state_dir / "initialize", build_identity(*texts))
    wire = Wire(stdout_fd, answers)
    services: list[SandboxService] = []

    async def serve() -> None:
        lines = aiter(StdinLines(stdin_fd, wire.refuse))
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _signum in signals:
                        group.cancel_scope.cancel()
                        return

            if sys.platform != "win32":  # Windows' event loop has no signal handlers; stdin EOF still ends it
                group.start_soon(stop_on_signal)
            wire.on_disagreement = group.cancel_scope.cancel
            to_sdk, for_sdk = anyio.create_memory_object_stream[str](PENDING_LINES)

            async def front_desk() -> None:
                """Pass the client's lines on to the SDK, answering from the record what it may answer."""
                desk = FrontDesk()
                async with to_sdk:
                    async for line in lines:
                        request = desk.consider(line)
                        if request is not None:
                            recorded = (
                                None if request.record_only
                                else await anyio.to_thread.run_sync(answers.get, request, abandon_on_cancel=True)
                            )  # fmt: skip
                            if recorded is not None:
                                await wire.send_early(request, recorded)
                                desk.answered(request, recorded)
                                milestone(f"{request.method} answered from the record")
                            else:
                                wire.record(request)
                        await to_sdk.send(line)

            group.start_soon(front_desk)
            sdk_loaded = anyio.Event()

            async def load_sdk() -> None:
                await anyio.to_thread.run_sync(_load_sdk)
                milestone("MCP SDK imported")
                sdk_loaded.set()

            # One after the other: both are mostly CPU-bound imports under one GIL, and the service's are the few
            # that let the warm pool start filling while the SDK's load.
            service = await anyio.to_thread.run_sync(_build_service, settings, profile)
            milestone("sandbox service built (Docker's client imported)")
            services.append(service)
            group.start_soon(load_sdk)
            async with service.running():
                await sdk_loaded.wait()
                from mcp.server.stdio import stdio_server  # loaded by now: no wait on this thread

                from code_sandbox.serve.server import SandboxServer

                server = SandboxServer(service)
                async with stdio_server(stdin=_sdk_stream(for_sdk), stdout=_sdk_stream(wire)) as (read, write):
                    await server.run(read, write, server.create_initialization_options())
            group.cancel_scope.cancel()

    try:
        anyio.run(serve)
    except BaseExceptionGroup as group:  # an error of ours, raised inside the task groups: say it plainly
        ours = group.subgroup(SandboxError)
        while ours is not None and isinstance(ours.exceptions[0], BaseExceptionGroup):
            ours = ours.exceptions[0]
        if ours is not None:
            raise ours.exceptions[0] from None
        raise
    finally:
        for service in services:
            service.engine.close()


def _load_sdk() -> None:
    """Import the MCP server and the SDK's stdio transport: most of a second, spent on a worker thread, so that
    importing them again on the event loop finds them loaded."""
    for module in ("mcp.server.stdio", "code_sandbox.serve.server"):
        importlib.import_module(module)


class _LineWriter(Protocol):
    async def write(self, text: str) -> int: ...

    async def flush(self) -> None: ...


def _sdk_stream(stream: AsyncIterable[str] | _LineWriter) -> anyio.AsyncFile[str]:
    """``stream`` as the SDK's stdio transport declares its streams: ``anyio.AsyncFile[str]``, of which it only
    iterates stdin and awaits ``write`` and ``flush`` on stdout, all that :class:`Wire` and the client's lines have."""
    return cast("anyio.AsyncFile[str]", stream)


def _build_service(settings: Settings, profile: Profile) -> SandboxService:
    from code_sandbox.sandbox.service import SandboxService

    return SandboxService(settings, profile)
