"""An exec's attach stream: stdin sent in chunks within a deadline, and Docker's multiplexed output read back frame by
frame (8-byte headers: stream id, 3 zero bytes, big-endian length), every length checked before it is read."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterable

from code_sandbox.docker_engine.sdk import RawStream, stream_parts
from code_sandbox.engine import LineRequest, OutputSink, StderrSink
from code_sandbox.errors import ErrorCode, SandboxError

STDOUT, STDERR = 1, 2


def send_all(raw: RawStream, chunks: Iterable[bytes], deadline: float) -> None:
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                raw.settimeout(max(deadline - time.monotonic(), 0.001))
                sent = raw.send(view)
                view = view[sent:]
    except TimeoutError:
        raise SandboxError(ErrorCode.TIMEOUT, "sending files to the sandbox took too long") from None
    except Exception:  # OSError here; other transports (a Windows named pipe) raise their own types
        raise SandboxError(ErrorCode.TRANSFER_FAILED, "the transfer to the sandbox broke off") from None


def close_stdin(raw: RawStream) -> None:
    """Half-close tells the process no more input comes. Only on a plain socket: on TLS it would end the session
    layer, and a Windows named pipe closes entirely. Our helpers read exact lengths anyway."""
    if type(raw) is socket.socket:
        with contextlib.suppress(OSError):
            raw.shutdown(socket.SHUT_WR)


def recv_exact(raw: RawStream, size: int, deadline: float) -> bytes | None:
    """Read exactly ``size`` bytes; ``None`` on a clean end of stream before the first byte."""
    parts: list[bytes] = []
    remaining = size
    while remaining:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not answer in time")
        raw.settimeout(left)
        try:
            chunk = raw.recv(min(remaining, 1 << 20))
        except TimeoutError:
            raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not answer in time") from None
        except Exception:  # OSError here; other transports (a Windows named pipe) raise their own types
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the connection to the sandbox broke off") from None
        if not chunk:
            if remaining == size:
                return None
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the connection to the sandbox broke off")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _header(raw: RawStream, deadline: float) -> tuple[int, int] | None:
    header = recv_exact(raw, 8, deadline)
    if header is None:
        return None
    stream, length = struct.unpack(">BxxxL", header)
    return stream, length


def _payload(raw: RawStream, length: int, deadline: float, broke: str) -> bytes:
    payload = recv_exact(raw, length, deadline) if length else b""
    if payload is None:
        raise SandboxError(ErrorCode.TRANSFER_FAILED, broke)
    return payload


def _out_of_protocol() -> SandboxError:
    return SandboxError(ErrorCode.TRANSFER_FAILED, "the sandbox helper answered out of protocol")


def read_frames(
    raw: RawStream, deadline: float, max_stdout: int, max_stderr: int, on_stderr: StderrSink | None
) -> tuple[bytes, bytes]:
    """Both streams to their end."""
    out = bytearray()
    err = bytearray()
    while (frame := _header(raw, deadline)) is not None:
        stream, length = frame
        target, limit = (out, max_stdout) if stream == STDOUT else (err, max_stderr)
        # Checked before reading: a bogus length must not make us buffer up to 4 GiB.
        if stream not in (STDOUT, STDERR) or len(target) + length > limit:
            raise _out_of_protocol()
        payload = _payload(raw, length, deadline, "the connection to the sandbox broke off")
        target.extend(payload)
        if stream == STDERR and on_stderr is not None:
            on_stderr(payload)
    return bytes(out), bytes(err)


PIECE = 64 * 1024


def relay_frames(raw: RawStream, deadline: float, on_output: OutputSink) -> None:
    """Both streams to their end, each frame handed on in pieces of at most :data:`PIECE` bytes and nothing kept: a
    watched program's output is bounded by whoever reads it, not here."""
    broke = "the connection to the sandbox broke off"
    while (frame := _header(raw, deadline)) is not None:
        stream, length = frame
        if stream not in (STDOUT, STDERR):
            raise _out_of_protocol()
        while length:
            piece = _payload(raw, min(length, PIECE), deadline, broke)
            length -= len(piece)
            on_output(stream, piece)


def close_stream(attached: object, raw: RawStream) -> None:
    """Close an exec's attach stream for good, and everything that holds it open."""
    for part in stream_parts(attached, raw):
        close = getattr(part, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):  # a response's close may raise what its transport raises
                close()


class HeldExec:
    """An exec's attach stream, held open (:class:`~code_sandbox.engine.ExecStream`)."""

    def __init__(self, attached: object, raw: RawStream) -> None:
        self._attached = attached
        self._raw = raw
        self.closed = False

    def send(self, chunks: Iterable[bytes], deadline: float) -> None:
        send_all(self._raw, chunks, deadline)

    def read_line(self, request: LineRequest) -> bytes:
        """See :meth:`code_sandbox.engine.ExecStream.read_line`. Stderr can arrive after stdout (dockerd copies the
        two streams separately), hence ``until``."""
        deadline, max_stdout, max_stderr = request.deadline, request.max_stdout, request.max_stderr
        on_stderr, until = request.on_stderr, request.until
        out = bytearray()
        err_bytes = 0
        closed = "the channel to the sandbox closed"
        while True:
            frame = _header(self._raw, deadline)
            if frame is None:
                raise SandboxError(ErrorCode.TRANSFER_FAILED, closed)
            stream, length = frame
            if stream == STDOUT and len(out) + length <= max_stdout:
                out.extend(_payload(self._raw, length, deadline, closed))
                end = out.find(b"\n")
                if end == -1:
                    continue
                if end != len(out) - 1:
                    raise _out_of_protocol()
                if until is None or until():
                    return bytes(out[:end])
                max_stdout = len(out)  # nothing more may come on stdout before the rest of stderr
                continue
            if stream == STDERR and err_bytes + length <= max_stderr:
                payload = _payload(self._raw, length, deadline, closed)
                err_bytes += length
                if on_stderr is not None:
                    on_stderr(payload)
                if until is not None and out.endswith(b"\n") and until():
                    return bytes(out[:-1])
                continue
            raise _out_of_protocol()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)  # wakes a read in another thread, which then sees the end
        close_stream(self._attached, self._raw)
