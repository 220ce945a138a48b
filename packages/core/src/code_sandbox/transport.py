"""How core reaches the helpers inside a sandbox: one small typed interface, and its Docker implementation.

Every call takes a request model and returns an answer model (or the helper's :class:`Refusal`); whatever else
happens is one of three errors: :class:`HelperCrash` (the helper did not keep to the protocol: the sandbox can no
longer be trusted), or a :class:`SandboxError` with ``TIMEOUT`` or ``CONTAINER_UNAVAILABLE``. The Docker transport
is the one place where exec results and parse failures become those errors.

On the wire (Docker): each call is one exec of the profile's helper argv plus the operation's arguments. A request
goes over stdin as one frame (4-byte big-endian length, then UTF-8 JSON; ``-`` as the last argument says so),
followed by any payload; the helper answers with exactly one JSON line on stdout and exits 0, refusals included.
"""

from __future__ import annotations

import abc
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from code_sandbox.engine import DockerEngine, ExecResult
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SUPERVISOR_USER
from code_sandbox.profile import HelperKind, Profile
from code_sandbox.protocol import (
    DeleteRequest,
    DigestRequest,
    InventoryRequest,
    KillAllAnswer,
    ListRequest,
    M,
    Message,
    ReadRequest,
    ReadyAnswer,
    Refusal,
    RunAnswer,
    RunRequest,
    SurveyAnswer,
    WriteRequest,
    parse_answer,
)

MiB = 1024 * 1024
FileRequest = WriteRequest | ListRequest | ReadRequest | DeleteRequest | DigestRequest | InventoryRequest
_OPERATIONS: dict[type[Message], str] = {
    WriteRequest: "write",
    ListRequest: "list",
    ReadRequest: "read",
    DeleteRequest: "delete",
    DigestRequest: "digest",
    InventoryRequest: "inventory",
}
StderrSink = Callable[[bytes], None]


class HelperCrash(SandboxError):
    """The helper did not answer within its protocol; the caller must destroy the session."""

    def __init__(self, message: str = "the sandbox helper failed") -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, message)


@dataclass(frozen=True)
class Target:
    """One sandbox as a transport addresses it. ``container`` never leaves core."""

    container: str
    user: str
    """The sandbox's ``uid:gid``: user code and the helpers that touch its content run as it."""


class Transport(abc.ABC):
    """The helpers of any sandbox, as typed calls. Blocking: async callers run them in worker threads.

    :raises HelperCrash: the helper crashed, exited nonzero, answered out of protocol, or the stream broke.
    :raises SandboxError: ``TIMEOUT`` past ``timeout`` seconds, ``CONTAINER_UNAVAILABLE`` when the sandbox is gone.
    """

    @abc.abstractmethod
    def files(
        self, target: Target, request: FileRequest, answer: type[M], *, payload: Iterable[bytes] = (), timeout: float
    ) -> M | Refusal:
        """One file-helper operation on the workspace; ``payload`` follows the request (a write's files)."""

    @abc.abstractmethod
    def run(
        self, target: Target, request: RunRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> RunAnswer | Refusal:
        """One program run by the runner. ``on_stderr`` gets the runner's progress and output lines as they come;
        it may raise to reject one, which is a crash like any other protocol violation."""

    @abc.abstractmethod
    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        """Kill every process of the sandbox's uid at once and report whether a scan then found none."""

    @abc.abstractmethod
    def survey(self, target: Target, release: Callable[[], bool], *, timeout: float) -> SurveyAnswer | Refusal:
        """Count, as the supervisor uid, the live processes of any other unprivileged uid.

        Started beside a run so that its start-up is paid early: it blocks on ``release()`` (called in the worker
        thread), scans when that returns true, and ends unheard (a refusal) when it returns false.
        """

    @abc.abstractmethod
    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        """Whether the container's watchdog has installed its claim-signal handler."""


def request_frame(request: Message) -> bytes:
    """A request as one stdin frame: a 4-byte big-endian length, then UTF-8 JSON.

    Requests go over stdin, not argv, because the kernel caps one argv string at 128 KiB, which 32 arguments of
    4 KiB (or 100 long paths) exceed once written as JSON.
    """
    body = request.model_dump_json().encode()
    return struct.pack(">I", len(body)) + body


class DockerTransport(Transport):
    """Each call is one ``docker exec`` of the profile's helper (:meth:`DockerEngine.exec`)."""

    def __init__(self, engine: DockerEngine, profile: Profile) -> None:
        self.engine = engine
        self.profile = profile

    def files(
        self, target: Target, request: FileRequest, answer: type[M], *, payload: Iterable[bytes] = (), timeout: float
    ) -> M | Refusal:
        operation = _OPERATIONS[type(request)]
        return self._call(target, "files", [operation], answer, request=request, payload=payload, timeout=timeout)

    def run(
        self, target: Target, request: RunRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> RunAnswer | Refusal:
        return self._call(
            target,
            "runner",
            [],
            RunAnswer,
            request=request,
            timeout=timeout,
            max_answer=8 * MiB,
            max_stderr=8 * MiB,  # progress lines, and streamed output when asked for
            on_stderr=on_stderr,
        )

    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        return self._call(target, "runner", ["--kill-all"], KillAllAnswer, timeout=timeout)

    def survey(self, target: Target, release: Callable[[], bool], *, timeout: float) -> SurveyAnswer | Refusal:
        def gate() -> Iterator[bytes]:
            if release():
                yield b"\n"

        supervisor = Target(target.container, SUPERVISOR_USER)
        return self._call(supervisor, "runner", ["--survey"], SurveyAnswer, payload=gate(), timeout=timeout)

    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        return self._call(target, "runner", ["--watchdog-ready"], ReadyAnswer, timeout=timeout)

    def _call(
        self,
        target: Target,
        helper: HelperKind,
        arguments: Sequence[str],
        answer: type[M],
        *,
        request: Message | None = None,
        payload: Iterable[bytes] | None = None,
        timeout: float,
        max_answer: int = 16 * MiB,
        max_stderr: int = MiB,
        on_stderr: StderrSink | None = None,
    ) -> M | Refusal:
        """Run one helper exec and parse its one answer line strictly: the only place exec outcomes and parse
        failures become :class:`HelperCrash`."""
        argv = [*self.profile.helper_argv(helper), *arguments]
        stdin = payload
        if request is not None:
            argv.append("-")
            stdin = itertools.chain([request_frame(request)], payload or ())
        try:
            result = self._exec(
                target, argv, stdin=stdin, timeout=timeout, max_stdout=max_answer, max_stderr=max_stderr,
                on_stderr=on_stderr,
            )  # fmt: skip
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

    def _exec(
        self,
        target: Target,
        argv: list[str],
        *,
        stdin: Iterable[bytes] | None,
        timeout: float,
        max_stdout: int,
        max_stderr: int,
        on_stderr: StderrSink | None,
    ) -> ExecResult:
        """The raw exec; fault tests override it to corrupt what a real helper said."""
        return self.engine.exec(
            target.container, argv, user=target.user, stdin=stdin, timeout=timeout, max_stdout=max_stdout,
            max_stderr=max_stderr, on_stderr=on_stderr,
        )  # fmt: skip
