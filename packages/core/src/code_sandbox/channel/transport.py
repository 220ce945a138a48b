"""How core reaches the helpers inside a sandbox: one small typed interface (:class:`Transport`), and the exec form
of a helper call (:class:`HelperExecs`). The transport that serves sandboxes is
:class:`~code_sandbox.channel.channels.ChannelTransport`.

Every call takes a request model and returns an answer model (or the helper's :class:`Refusal`); whatever else
happens is one of three errors: :class:`HelperCrash` (the helper did not keep to the protocol: the sandbox can no
longer be trusted), or a :class:`SandboxError` with ``TIMEOUT`` or ``CONTAINER_UNAVAILABLE``; :func:`untrusted` is
the one place where anything else becomes a crash.

The exec form: each call is one exec of the profile's helper argv plus the operation's arguments. A request goes
over stdin as one frame (4-byte big-endian length, then UTF-8 JSON; ``-`` as the last argument says so), followed by
any payload; the helper answers with exactly one JSON line on stdout and exits 0, refusals included.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import struct
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass

from code_sandbox.channel.protocol import (
    DeleteRequest,
    DigestRequest,
    EvaluateAnswer,
    EvaluateRequest,
    ExecuteAnswer,
    ExecuteRequest,
    KillAllAnswer,
    ListRequest,
    M,
    Message,
    PackAnswer,
    PackRequest,
    ReadRequest,
    ReadyAnswer,
    Refusal,
    RunAnswer,
    RunRequest,
    SnapshotFile,
    SurveyAnswer,
    UnpackRequest,
    WriteAnswer,
    WriteRequest,
    parse_answer,
)
from code_sandbox.engine import Engine, ExecRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import with_readable_runtime
from code_sandbox.profile import HelperKind, Profile

MiB = 1024 * 1024
FileRequest = WriteRequest | ListRequest | ReadRequest | DeleteRequest | DigestRequest | UnpackRequest
OPERATIONS: dict[type[Message], str] = {
    WriteRequest: "write",
    ListRequest: "list",
    ReadRequest: "read",
    DeleteRequest: "delete",
    DigestRequest: "digest",
    UnpackRequest: "unpack",
}
StderrSink = Callable[[bytes], None]
PACK_HEADER_BYTES = 8 * MiB + 1
"""The most a pack's answer line may take besides the files' bytes, with its newline: the helper refuses a listing of
more (``SNAPSHOT_TOO_LARGE``)."""


class HelperCrash(SandboxError):
    """The helper did not answer within its protocol; the caller must destroy the session.

    :param cause: what went wrong, in our words or by exception type, for the operator's log (never a client's).
    """

    def __init__(self, message: str = "the sandbox helper failed", *, cause: str | None = None) -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, message)
        self.cause = cause


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

    def execute(
        self,
        target: Target,
        request: ExecuteRequest,
        *,
        payload: Iterable[bytes],
        timeout: float,
        on_stderr: StderrSink | None = None,
    ) -> ExecuteAnswer | Refusal:
        """A one-shot: the write (``payload`` is its files), then the run only if every file was written; the first
        refusal is the answer. Here two calls within ``timeout``; a channel makes it one request."""
        deadline = time.monotonic() + timeout
        written = self.files(target, request.write, WriteAnswer, payload=payload, timeout=timeout)
        if isinstance(written, Refusal):
            return written
        ran = self.run(target, request.run, timeout=max(deadline - time.monotonic(), 0.001), on_stderr=on_stderr)
        if isinstance(ran, Refusal):
            return ran
        return ExecuteAnswer(ok=True, written=written, run=ran)

    def supports_evaluation(self) -> bool:
        """Whether :meth:`evaluate` keeps a context between calls (may ask the engine which runtime it uses)."""
        return False

    def supports_warm_pool(self) -> bool:
        """Whether containers may be started ahead and readied for a claim (may ask the engine which runtime it uses):
        the claim signals the watchdog, which must be seen ready for it first (:meth:`watchdog_ready`)."""
        return True

    def evaluate(
        self, target: Target, request: EvaluateRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> EvaluateAnswer | Refusal:
        """Code run in the sandbox's evaluation context, which lives between calls. Only a transport that keeps a
        channel open keeps a context: this one refuses."""
        del target, request, timeout, on_stderr
        return Refusal(ok=False, code="INVALID_REQUEST", message="evaluation needs a channel")

    def pack(self, target: Target, request: PackRequest, *, timeout: float) -> tuple[PackAnswer, bytes] | Refusal:
        """Every entry of the workspace, and its files' bytes in the answer's order (a snapshot's content). Only a
        transport that runs the file helper as a program of its own packs: this one refuses."""
        del target, request, timeout
        return Refusal(ok=False, code="NOT_SUPPORTED", message="this transport takes no snapshots")

    @abc.abstractmethod
    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        """Kill every process of the sandbox's uid at once and report whether a scan then found none."""

    @abc.abstractmethod
    def survey(self, target: Target, *, timeout: float) -> SurveyAnswer | Refusal:
        """Count, as the supervisor uid, the live processes of any other unprivileged uid but the target's channel
        (and what it keeps between calls). Asked once a call is over."""

    @abc.abstractmethod
    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        """Whether the container's watchdog has installed its claim-signal handler."""

    def prepare(self, target: Target) -> None:
        """Get ready to serve ``target`` (open what a first call would open), so that the first call is fast."""
        del target

    def rest(self, target: Target) -> None:  # noqa: B027 - deliberately empty: only a transport that holds something
        """The target's session is idle: let go of what is held for it between calls (the next call opens it again).
        Never called while a call of the session is under way."""

    def close(self, container: str) -> None:
        """Forget a container: it is being removed."""
        del container

    def close_all(self) -> None:  # noqa: B027 - deliberately empty: only a transport that holds something closes it
        """Forget every container (the server is shutting down)."""


@contextlib.contextmanager
def untrusted(on_failure: Callable[[], None] = lambda: None) -> Generator[None]:
    """The one place where anything that goes wrong while talking to a helper (a nonzero exit, a broken stream, a
    line no model accepts, any exception at all) becomes :class:`HelperCrash`; ``TIMEOUT`` and
    ``CONTAINER_UNAVAILABLE`` pass through. ``on_failure`` runs first (a channel drops itself). The crash keeps what
    went wrong as its ``cause``, in our words or by exception type only, so that where it ends a session (the
    channel's guard) a crash can be told from a broken stream."""
    try:
        yield
    except HelperCrash:
        on_failure()
        raise
    except SandboxError as error:
        on_failure()
        if error.code in (ErrorCode.TIMEOUT, ErrorCode.CONTAINER_UNAVAILABLE):
            raise
        raise HelperCrash(cause=error.for_operator()) from None
    except Exception as error:
        on_failure()
        raise HelperCrash(cause=type(error).__name__) from None


def runtime_argv(engine: Engine, profile: Profile, argv: Sequence[str]) -> list[str]:
    """``argv`` as it runs under the engine's runtime: under gVisor, with the runtime's readable copy. An engine that
    cannot say gets ``argv`` unchanged (the container's create call then fails in its own words)."""
    try:
        gvisor = engine.runtime_in_force().user_space_kernel
    except SandboxError:
        return list(argv)
    return with_readable_runtime(argv, profile.image_spec().runtime_path) if gvisor else list(argv)


def request_frame(request: Message) -> bytes:
    """A request as one stdin frame: a 4-byte big-endian length, then UTF-8 JSON.

    Requests go over stdin, not argv, because the kernel caps one argv string at 128 KiB, which 32 arguments of
    4 KiB (or 100 long paths) exceed once written as JSON.
    """
    body = request.model_dump_json().encode()
    return struct.pack(">I", len(body)) + body


class HelperExecs:
    """The exec form of a helper call: one ``docker exec`` of the profile's helper per call (:meth:`Engine.exec`),
    the request frame on its stdin, exactly one answer line on stdout and exit 0. The channel transport uses it for
    what must not go over a channel (the kill-all, which ends the channel too, and the watchdog check)."""

    def __init__(self, engine: Engine, profile: Profile, *, readable_runtime: bool = False) -> None:
        self.engine = engine
        self.profile = profile
        self.readable_runtime = readable_runtime
        """Run the runtime's readable copy (gVisor cannot execute the unreadable one)."""

    def helper_argv(self, helper: HelperKind) -> list[str]:
        """The argv prefix of ``helper``, as it runs under the runtime in force."""
        return self.argv(self.profile.helper_argv(helper))

    def argv(self, argv: Sequence[str]) -> list[str]:
        """Any argv as it runs under the runtime in force."""
        if self.readable_runtime:
            return with_readable_runtime(argv, self.profile.image_spec().runtime_path)
        return list(argv)

    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        return self.call(target, "runner", ["--kill-all"], KillAllAnswer, timeout=timeout)

    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        return self.call(target, "runner", ["--watchdog-ready"], ReadyAnswer, timeout=timeout)

    def pack(self, target: Target, request: PackRequest, *, timeout: float) -> tuple[PackAnswer, bytes] | Refusal:
        """``files pack``: its answer line, then exactly the bytes of the files it lists, and nothing after them."""
        argv = [*self.helper_argv("files"), "pack", "-"]
        limit = request.max_total_bytes + PACK_HEADER_BYTES
        with untrusted():
            result = self.engine.exec(
                target.container, ExecRequest(argv, target.user, timeout, limit, MiB, [request_frame(request)])
            )
            line, newline, body = result.stdout.partition(b"\n")
            if result.exit_code != 0 or not newline:
                raise HelperCrash(cause=f"exit code {result.exit_code}, no answer line")
            answer = parse_answer(line, PackAnswer)
            if isinstance(answer, Refusal):
                if body:
                    raise HelperCrash(cause="bytes after a refusal")
                return answer
            sizes = sum(entry.size for entry in answer.entries if isinstance(entry, SnapshotFile))
            if not sizes == answer.bytes == len(body) <= request.max_total_bytes:
                raise HelperCrash(cause="the bytes after the answer are not the files it lists")
            if len(answer.entries) + answer.skipped > request.max_entries:
                raise HelperCrash(cause="more entries than asked for")
            return answer, body

    def call(
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
        argv = [*self.helper_argv(helper), *arguments]
        stdin = payload
        if request is not None:
            argv.append("-")
            stdin = itertools.chain([request_frame(request)], payload or ())
        with untrusted():
            # A helper call without stdin (the kill-all, the watchdog check) is a query or idempotent, so it may run
            # again if the engine lost its answer.
            exec_request = ExecRequest(
                argv, target.user, timeout, max_answer, max_stderr, stdin, on_stderr, repeatable=stdin is None
            )
            result = self.engine.exec(target.container, exec_request)
            lines = result.stdout.split(b"\n")
            if result.exit_code != 0 or len(lines) != 2 or lines[1] != b"":
                raise HelperCrash(cause=f"exit code {result.exit_code}, {len(lines) - 1} answer line(s)")
            return parse_answer(lines[0], answer)
