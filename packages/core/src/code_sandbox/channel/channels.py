"""The transport that serves every sandbox: one held ``runner --channel`` exec per sandbox, a request a frame on its
stdin and its answer one line on its stdout, so a call costs neither a ``docker exec`` nor a runtime start and a
one-shot's files and run are one request; a second held exec as the supervisor uid counts survivors after a run."""

from __future__ import annotations

import contextlib
import itertools
import json
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from code_sandbox.channel.protocol import (
    ChannelHello,
    EvaluateAnswer,
    EvaluateRequest,
    ExecuteAnswer,
    ExecuteRequest,
    KillAllAnswer,
    M,
    Message,
    PackAnswer,
    PackRequest,
    ReadyAnswer,
    Refusal,
    RunAnswer,
    RunRequest,
    SurveyAnswer,
    parse_answer,
    parse_message,
)
from code_sandbox.channel.transport import (
    OPERATIONS,
    FileRequest,
    HelperCrash,
    HelperExecs,
    MiB,
    StderrSink,
    Target,
    Transport,
    untrusted,
)
from code_sandbox.engine import Engine, ExecStream, LineRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SUPERVISOR_USER
from code_sandbox.profile import Profile

OPEN_SECONDS = 30.0
"""How long a new channel may take to say hello (a runtime start in a loaded container)."""
CLOSED_KEPT = 4096
"""How many closed containers a channel transport remembers: far more than can be closed while one opener runs."""


class ChannelTransport(Transport):
    """File operations and runs over one held exec per sandbox (``runner --channel``): a request is a frame on its
    stdin and its answer one line on its stdout, so a call costs neither a ``docker exec`` nor a runtime start, and a
    one-shot's files and run are one request.

    The survey goes over a second held exec, as the supervisor uid (``runner --supervise``: one survey per line).
    The kill-all and the watchdog check stay execs: they must work while the channel is busy or not yet open.

    Whatever goes wrong on a channel (it ends, says too much, is too slow) is a crash or a timeout like any
    helper's: the channel is dropped and the caller destroys the sandbox (a channel that died between calls is
    found by the next call, the same way). Only a channel that the host's own kill-all ended (a cancelled run,
    whose cleanup the survey then proves) is opened again, by the next call.
    """

    def __init__(self, engine: Engine, profile: Profile, *, readable_runtime: bool = False) -> None:
        self.engine = engine
        self.profile = profile
        self.execs = HelperExecs(engine, profile, readable_runtime=readable_runtime)
        """The exec form, for the kill-all and the watchdog check."""
        self._channels: dict[Target, tuple[ExecStream, int]] = {}
        self._contexts: dict[Target, str] = {}
        """Each channel's evaluation context while it lives, paused, between calls: ``pid:start-time``."""
        self._waiting: dict[Target, str] = {}
        """Each channel's next run's waiting process, as the channel announced it: ``>tick`` (a child of the channel
        started at or after that tick)."""
        self._supervisors: dict[str, ExecStream] = {}
        self._gates: dict[tuple[str, str], threading.Lock] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        """Containers closed (being removed), the latest :data:`CLOSED_KEPT` of them: a channel that an opener
        finishes for one of them is closed at once."""
        self._opened: set[Target] = set()
        """Targets whose channel has been opened at least once (until their container is closed)."""
        self._shut = False
        """Set by :meth:`close_all`: from then on no channel is opened or kept, whoever opens it."""
        self._lock = threading.Lock()

    def prepare(self, target: Target) -> None:
        """Open the target's first channel (and the supervisor's, on the side); never a later one: a channel that
        was dropped is opened again only by the next call, after whatever dropped it has been dealt with."""
        with untrusted():
            self._open(target, first_only=True)

    def rest(self, target: Target) -> None:
        """Close the channel (its runner ends, and the next run's process with it) and the supervisor's exec, unless an
        evaluation context lives: that is the user's state, and only its channel may spare it."""
        with self._lock:
            if target in self._contexts:
                return
        self._drop(target)
        self._drop_supervisor(target.container)

    def close(self, container: str) -> None:
        with self._lock:
            self._remember_closed([container])
            self._gates.pop(("channel", container), None)
            self._gates.pop(("supervisor", container), None)
            self._gates.pop(("survey", container), None)
            targets = [target for target in self._channels if target.container == container]
            self._opened = {target for target in self._opened if target.container != container}
        for target in targets:
            self._drop(target)
        self._drop_supervisor(container)

    def survey(self, target: Target, *, timeout: float) -> SurveyAnswer | Refusal:
        with untrusted(lambda: self._drop_supervisor(target.container)):
            held = self._supervisor(target.container)  # opened beside the channel, unless it was dropped since
            deadline = time.monotonic() + min(timeout, OPEN_SECONDS)
            with self._gate(("survey", target.container)):  # one survey at a time on the held exec
                try:
                    held.send([self._survey_line(target)], deadline)
                    line = held.read_line(LineRequest(deadline, max_stdout=4096, max_stderr=4096))
                except BaseException:
                    # Dropped before the next survey may start: a late answer must never be read as its own.
                    self._drop_supervisor(target.container)
                    raise
            return parse_answer(line, SurveyAnswer)

    def _supervisor(self, container: str) -> ExecStream:
        with self._gate(("supervisor", container)):
            with self._lock:
                held = self._supervisors.get(container)
            if held is not None and not held.closed:
                return held
            argv = [*self.execs.helper_argv("runner"), "--supervise"]
            opened = self.engine.open_exec(container, argv, user=SUPERVISOR_USER)
            return self._keep(container, opened, lambda: self._supervisors.__setitem__(container, opened))

    def _open_supervisor_soon(self, container: str) -> None:
        """Open the supervisor's channel on a thread of its own, so that the first run's survey finds it open."""

        def open_quietly() -> None:
            with contextlib.suppress(Exception):  # the survey opens it itself if this failed
                self._supervisor(container)

        threading.Thread(target=open_quietly, name="code-sandbox supervisor", daemon=True).start()

    def _remember_closed(self, containers: Iterable[str]) -> None:
        """Note containers as closed (the caller holds the lock). Only the latest are kept: the note matters while an
        opener that started before the close may still finish, which is at most :data:`OPEN_SECONDS`."""
        for container in containers:
            self._closed[container] = None
            self._closed.move_to_end(container)
        while len(self._closed) > CLOSED_KEPT:
            self._closed.popitem(last=False)

    def _gate(self, key: tuple[str, str]) -> threading.Lock:
        """One opener at a time per channel, so that two callers never open two of them."""
        with self._lock:
            if self._shut or key[1] in self._closed:  # a late opener: no gate is made again for a closed container
                raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone")
            return self._gates.setdefault(key, threading.Lock())

    def _keep(self, container: str, opened: ExecStream, store: Callable[[], None]) -> ExecStream:
        """Record a channel just opened, unless its container was closed meanwhile (then close it too)."""
        with self._lock:
            if self._shut or container in self._closed:
                opened.close()
                raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone")
            store()
        return opened

    def _drop_supervisor(self, container: str) -> None:
        with self._lock:
            held = self._supervisors.pop(container, None)
        if held is not None:
            held.close()

    def files(
        self, target: Target, request: FileRequest, answer: type[M], *, payload: Iterable[bytes] = (), timeout: float
    ) -> M | Refusal:
        operation = OPERATIONS[type(request)]
        frame = _envelope(operation, request)
        return self._exchange(target, itertools.chain([frame], payload), answer, timeout=timeout)

    def run(
        self, target: Target, request: RunRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> RunAnswer | Refusal:
        frame = _envelope("run", self._as_run(request))
        self._forget_context(target)  # the run's cleanup kills it (and the run takes the waiting process)
        answer = self._exchange(
            target, [frame], RunAnswer, timeout=timeout, max_answer=8 * MiB, max_stderr=8 * MiB,
            on_stderr=on_stderr,
        )  # fmt: skip
        self._set_waiting(target, answer.next_after if isinstance(answer, RunAnswer) else None)
        return answer

    def execute(
        self,
        target: Target,
        request: ExecuteRequest,
        *,
        payload: Iterable[bytes],
        timeout: float,
        on_stderr: StderrSink | None = None,
    ) -> ExecuteAnswer | Refusal:
        frame = _envelope("execute", request.model_copy(update={"run": self._as_run(request.run)}))
        self._forget_context(target)
        answer = self._exchange(
            target, itertools.chain([frame], payload), ExecuteAnswer, timeout=timeout,
            max_answer=9 * MiB, max_stderr=8 * MiB, on_stderr=on_stderr,
        )  # fmt: skip
        if isinstance(answer, Refusal):
            self._drop(target)  # the channel ends after refusing a one-shot; a later call opens a new one
        self._set_waiting(target, None)  # it ran the program, or was ended: the channel starts none after a one-shot
        return answer

    def _as_run(self, request: RunRequest) -> RunRequest:
        """The program as the runtime in force starts it: under gVisor with the runtime's readable copy."""
        if not self.execs.readable_runtime:
            return request
        return request.model_copy(update={"argv": self.execs.argv(request.argv)})

    def supports_evaluation(self) -> bool:
        return True

    def evaluate(
        self, target: Target, request: EvaluateRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> EvaluateAnswer | Refusal:
        frame = _envelope("evaluate", request)
        self._forget_context(target)  # until the answer says that it lives on
        answer = self._exchange(
            target, [frame], EvaluateAnswer, timeout=timeout, max_answer=8 * MiB, max_stderr=8 * MiB,
            on_stderr=on_stderr,
        )  # fmt: skip
        self._set_waiting(target, None)  # an evaluation ends it first
        if isinstance(answer, EvaluateAnswer) and answer.context_pid is not None and answer.context_started is not None:
            with self._lock:
                if target in self._channels:
                    self._contexts[target] = f"{answer.context_pid}:{answer.context_started}"
        return answer

    def _forget_context(self, target: Target) -> None:
        """A run's cleanup, a kill-all or a dropped channel ends the context: the survey spares it no longer. Every
        supervised call ends the waiting process too, or runs the program in it."""
        with self._lock:
            self._contexts.pop(target, None)
            self._waiting.pop(target, None)

    def _set_waiting(self, target: Target, after: int | None) -> None:
        """The waiting process is exactly the one the last answer announced (``after``: the tick it starts at or after),
        or none. Whatever was noted before a supervised call (a hello read while the call opened the channel) was used
        or ended by it."""
        with self._lock:
            if after is not None and target in self._channels:
                self._waiting[target] = f">{after}"
            else:
                self._waiting.pop(target, None)

    def pack(self, target: Target, request: PackRequest, *, timeout: float) -> tuple[PackAnswer, bytes] | Refusal:
        return self.execs.pack(target, request, timeout=timeout)

    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        # Kills every process of the sandbox uid, the channel included; the next call opens a new one.
        self._forget_context(target)
        try:
            return self.execs.kill_all(target, timeout=timeout)
        finally:
            self._drop(target)

    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        return self.execs.watchdog_ready(target, timeout=timeout)

    def _channel(self, target: Target) -> ExecStream:
        held = self._open(target, first_only=False)
        if held is None:  # only a first-only open gives up
            raise HelperCrash()
        return held

    def _open(self, target: Target, *, first_only: bool) -> ExecStream | None:
        """The target's open channel, opened now if need be; ``None`` when ``first_only`` and one was opened before."""
        with self._gate(("channel", target.container)):
            with self._lock:
                known = self._channels.get(target)
                if (known is None or known[0].closed) and first_only and target in self._opened:
                    return None
                self._opened.add(target)
            if known is not None and not known[0].closed:
                return known[0]
            opened = self._open_channel(target)
            try:
                deadline = time.monotonic() + OPEN_SECONDS
                hello = parse_message(
                    opened.read_line(LineRequest(deadline, max_stdout=4096, max_stderr=4096)), ChannelHello
                )
            except BaseException:
                opened.close()
                raise
            self._keep(target.container, opened, lambda: self._channels.__setitem__(target, (opened, hello.pid)))
            self._set_waiting(target, hello.next_after)  # a new channel's own, or none
        self._open_supervisor_soon(target.container)
        return opened

    def _open_channel(self, target: Target) -> ExecStream:
        """Start the target's channel, as the sandbox uid (a subclass may start it otherwise)."""
        argv = [*self.execs.helper_argv("runner"), "--channel"]
        return self.engine.open_exec(target.container, argv, user=target.user)

    def _survey_line(self, target: Target) -> bytes:
        with self._lock:
            known = self._channels.get(target)
            context = self._contexts.get(target)
            waiting = self._waiting.get(target)
        spared = [] if known is None else [known[1], *(extra for extra in (context, waiting) if extra is not None)]
        return " ".join(map(str, spared)).encode() + b"\n"

    def _drop(self, target: Target) -> None:
        with self._lock:
            known = self._channels.pop(target, None)
            self._contexts.pop(target, None)
            self._waiting.pop(target, None)
        if known is not None:
            known[0].close()

    def close_all(self) -> None:
        """Close every channel and open none from now on (the server is shutting down; the containers go with it)."""
        with self._lock:
            self._shut = True  # and a channel being opened now is closed as its opener finishes
            targets, containers = list(self._channels), list(self._supervisors)
            self._remember_closed([*(target.container for target in targets), *containers])
        for target in targets:
            self._drop(target)
        for container in containers:
            self._drop_supervisor(container)

    def _exchange(
        self,
        target: Target,
        chunks: Iterable[bytes],
        answer: type[M],
        *,
        timeout: float,
        max_answer: int = 16 * MiB,
        max_stderr: int = MiB,
        on_stderr: StderrSink | None = None,
    ) -> M | Refusal:
        deadline = time.monotonic() + timeout
        with untrusted(lambda: self._drop(target)):
            held = self._channel(target)
            held.send(chunks, deadline)
            line = read_answer(held, deadline, max_answer, max_stderr, on_stderr)
            return parse_answer(line, answer)


def read_answer(
    held: ExecStream, deadline: float, max_stdout: int, max_stderr: int, on_stderr: StderrSink | None
) -> bytes:
    """The answer line of one channel request, once its stderr has ended too (the ``{"end":true}`` line the helper
    writes after all of it)."""
    lines = _StderrLines(on_stderr)
    return held.read_line(LineRequest(deadline, max_stdout, max_stderr, on_stderr=lines.feed, until=lines.ended))


class _StderrLines:
    """A request's stderr, split into lines: each goes on to ``sink`` except the end marker, which is remembered.
    Anything after the marker is out of protocol."""

    END = b'{"end":true}'

    def __init__(self, sink: StderrSink | None) -> None:
        self._sink = sink
        self._partial = b""
        self._ended = False

    def feed(self, chunk: bytes) -> None:
        *complete, self._partial = (self._partial + chunk).split(b"\n")
        for line in complete:
            if self._ended:
                raise SandboxError(ErrorCode.TRANSFER_FAILED, "the sandbox helper wrote past its end marker")
            if line == self.END:
                self._ended = True
            elif self._sink is not None:
                self._sink(line + b"\n")
        if self._ended and self._partial:
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the sandbox helper wrote past its end marker")

    def ended(self) -> bool:
        return self._ended


def _envelope(operation: str, request: Message) -> bytes:
    body = b'{"op":' + json.dumps(operation).encode() + b',"request":' + request.model_dump_json().encode() + b"}"
    return struct.pack(">I", len(body)) + body
