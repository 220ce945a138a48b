"""Calling the in-container helpers: one exec, one JSON answer, fail closed on anything unexpected.

Helpers answer with exactly one JSON line on stdout and exit 0 (also for refusals). Any other outcome (a crash, a
nonzero exit, no answer, an out-of-protocol answer, a broken stream) means the sandbox can no longer be trusted.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from code_sandbox.engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.protocol import M, Refusal, parse_answer

MiB = 1024 * 1024


class HelperCrash(SandboxError):
    """The helper did not answer within its protocol; the caller must destroy the session."""

    def __init__(self, message: str = "the sandbox helper failed") -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, message)


def request_frame(request: Mapping[str, Any]) -> bytes:
    """A helper request as one stdin frame: a 4-byte big-endian length, then UTF-8 JSON.

    Requests go over stdin, not argv, because the kernel caps one argv string at 128 KiB, which 32 arguments
    of 4 KiB (or 100 long paths) exceed once written as JSON.
    """
    body = json.dumps(request, ensure_ascii=False).encode()
    return struct.pack(">I", len(body)) + body


def call_helper(
    engine: DockerEngine,
    container_id: str,
    argv: list[str],
    *,
    user: str,
    answer: type[M],
    request: Mapping[str, Any] | None = None,
    stdin: Iterable[bytes] | None = None,
    timeout: float,
    max_answer: int = 16 * MiB,
    max_stderr: int = MiB,
    on_stderr: Callable[[bytes], None] | None = None,
) -> M | Refusal:
    """Run one helper exec as ``user`` and return its answer, parsed strictly as ``answer`` or a refusal.

    The helper must write exactly one line and exit 0. ``on_stderr`` may raise to reject what it reads: like any
    other exception while reading or parsing, that is a crash.

    :raises HelperCrash: the helper crashed, exited nonzero, answered out of protocol, or the stream broke.
    :raises SandboxError: ``TIMEOUT`` or ``CONTAINER_UNAVAILABLE`` from the engine.
    """
    if request is not None:
        argv = [*argv, "-"]
        stdin = itertools.chain([request_frame(request)], stdin or ())
    try:
        result = engine.exec(
            container_id,
            argv,
            user=user,
            stdin=stdin,
            timeout=timeout,
            max_stdout=max_answer,
            max_stderr=max_stderr,
            on_stderr=on_stderr,
        )
        lines = result.stdout.split(b"\n")
        if result.exit_code != 0 or len(lines) != 2 or lines[1] != b"":
            raise HelperCrash()
        return parse_answer(lines[0], answer)
    except SandboxError as error:
        if error.code in (ErrorCode.TIMEOUT, ErrorCode.CONTAINER_UNAVAILABLE):
            raise
        raise HelperCrash() from None
    except Exception:  # anything at all while reading or parsing: the helper cannot be trusted
        raise HelperCrash() from None
