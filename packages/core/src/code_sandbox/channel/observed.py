"""The engine-only transport, for runtimes whose kernel does not keep user code out of helpers of its own uid (gVisor):
the host believes nothing that a process of the sandbox uid says.

- A run is the program itself, started by the engine (:meth:`Engine.watch_exec`): its output is what the engine's
  attach stream carries, counted and cut at the caps here; its exit code is what the engine reports; its duration and
  deadline are the host's. Nothing of ours runs beside it as its uid.
- When the program exits, when its deadline passes or its output passes a cap, and when a run is cancelled,
  ``runner --kill-all`` is started as the sandbox uid. What it answers is not read for anything but form: the
  supervisor's survey (uid 65533, which user code can neither signal, trace nor read) counts what is left before the
  kill, which is the run's leftover count, and proves afterwards (:func:`~code_sandbox.sandbox.supervision.
  supervise_call`) that nothing of the sandbox uid lives.
- A file operation is one exec of the file helper, started while no process of the sandbox uid lives (the last run's
  survey proved it; calls on a sandbox are serialised), so nothing can reach it while it works.
- Evaluation is refused: a context is a process of the sandbox uid that lives between calls, which this model does
  not allow.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterable
from typing import Literal

from code_sandbox.channel.channels import ChannelTransport
from code_sandbox.channel.jailed import JailedTransport
from code_sandbox.channel.protocol import (
    EvaluateAnswer,
    EvaluateRequest,
    ExecuteAnswer,
    ExecuteRequest,
    KillAllAnswer,
    M,
    OutputPiece,
    PackAnswer,
    PackRequest,
    Progress,
    ReadyAnswer,
    Refusal,
    RunAnswer,
    RunRequest,
    SurveyAnswer,
)
from code_sandbox.channel.transport import (
    OPERATIONS,
    FileRequest,
    HelperCrash,
    StderrSink,
    Target,
    Transport,
    untrusted,
)
from code_sandbox.engine import Engine, NotStarted, Usage, WatchRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.profile import Profile

KILL_SECONDS = 10.0
"""How long one kill-all may take (a runtime start in a loaded gVisor sandbox); the survey judges what it did."""
SURVEY_SECONDS = 10.0
KILL_ATTEMPTS = 3
SETTLE_SECONDS = 0.1
PIECE_MS = 250
PIECE_BYTES = 64 * 1024
PROGRESS_MS = 1000
STDOUT, STDERR = 1, 2
SIGKILL_EXIT = 128 + 9
START_RETRY_PAUSES = (0.1, 0.5)
"""Before each new start of a program the runtime could not start (then nothing of it ran)."""


class EngineOnlyTransport(ChannelTransport):
    """Runs as programs the engine watches, file operations as one exec each, and the supervisor's held survey (see
    the module's docstring). No channel of the sandbox uid is ever opened."""

    def __init__(self, engine: Engine, profile: Profile) -> None:
        super().__init__(engine, profile, readable_runtime=True)

    def supports_warm_pool(self) -> bool:
        """No: a warm container is readied for its claim with ``runner --watchdog-ready`` run as the sandbox uid, which
        this model believes nothing of."""
        return False

    def prepare(self, target: Target) -> None:
        """Open the supervisor's channel, the only held exec here."""
        with untrusted(lambda: self._drop_supervisor(target.container)):
            self._supervisor(target.container)

    def supports_evaluation(self) -> bool:
        return False

    def files(
        self, target: Target, request: FileRequest, answer: type[M], *, payload: Iterable[bytes] = (), timeout: float
    ) -> M | Refusal:
        operation = OPERATIONS[type(request)]
        return self.execs.call(target, "files", [operation], answer, request=request, payload=payload, timeout=timeout)

    def run(
        self, target: Target, request: RunRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> RunAnswer | Refusal:
        watched = _WatchedRun(self, target, request, on_stderr)
        with untrusted():
            return watched.run(timeout)

    def execute(
        self,
        target: Target,
        request: ExecuteRequest,
        *,
        payload: Iterable[bytes],
        timeout: float,
        on_stderr: StderrSink | None = None,
    ) -> ExecuteAnswer | Refusal:
        """The write, then the run (as two calls: there is no channel to make them one request)."""
        return Transport.execute(self, target, request, payload=payload, timeout=timeout, on_stderr=on_stderr)

    def evaluate(
        self, target: Target, request: EvaluateRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> EvaluateAnswer | Refusal:
        return Transport.evaluate(self, target, request, timeout=timeout, on_stderr=on_stderr)

    def leftovers(self, target: Target) -> int:
        """How many processes of the sandbox uid live now, as the supervisor counts them; a survey that cannot
        answer is a crash."""
        answer = self.survey(target, timeout=SURVEY_SECONDS)
        if isinstance(answer, Refusal):
            raise HelperCrash(cause="the supervisor refused a survey")
        return answer.alive

    def usage(self, target: Target) -> Usage | None:
        """The engine's counters for the sandbox, or ``None`` where it cannot read them."""
        try:
            return self.engine.usage(target.container)
        except SandboxError:
            return None

    def end_all(self, target: Target) -> bool:
        """Kill every process of the sandbox uid. What the kill-all says is not believed: the survey proves it.
        ``False`` when the exec did not finish in time: it may then start later, after any proof, and kill what the
        next call runs, so the caller must give the sandbox up."""
        try:
            self.execs.kill_all(target, timeout=KILL_SECONDS)
        except SandboxError as error:
            return error.code != ErrorCode.TIMEOUT
        return True


class _WatchedRun:
    """One program run by the engine: its output counted and kept up to the caps, streamed pieces and progress lines
    made here (in the runner's format, so the relay reads them as it reads any), the kill at the deadline or a cap,
    and the leftovers ended when the program exits."""

    def __init__(
        self, transport: EngineOnlyTransport, target: Target, request: RunRequest, on_stderr: StderrSink | None
    ) -> None:
        self.transport = transport
        self.target = target
        self.request = request
        self.on_stderr = on_stderr
        self.lock = threading.Lock()
        self.kept = {STDOUT: bytearray(), STDERR: bytearray()}
        self.counts = {STDOUT: 0, STDERR: 0}
        self.caps = {STDOUT: request.stdout_cap, STDERR: request.stderr_cap}
        self.unsent = {STDOUT: 0, STDERR: 0}
        """How many kept bytes of each stream have not been streamed yet."""
        self.sent_at = {STDOUT: 0.0, STDERR: 0.0}
        self.killed: str | None = None
        """Why the host killed the program ("deadline", "stdout", "stderr"), or ``None``."""
        self.killer: threading.Thread | None = None
        """The kill-all started when the host killed the program: waited for before the leftovers are counted, as it
        is a process of the sandbox uid itself."""
        self.cleaned = False
        self.kill_unfinished = False
        """A kill-all exec did not finish in time (it may yet start, after the proof): the sandbox must go."""
        self.leftover = 0
        self.cleanup_lock = threading.Lock()
        self.started = time.monotonic()
        self.finished = threading.Event()
        self.emit_lock = threading.Lock()

    def run(self, timeout: float) -> RunAnswer:
        argv = self.transport.execs.argv(self.request.argv)
        watch = WatchRequest(argv, self.target.user, self.started + timeout, self.output, self.exited)
        deadline = threading.Timer(self.request.timeout_ms / 1000, self.kill, ("deadline",))
        deadline.daemon = True
        deadline.start()
        before = self.transport.usage(self.target)
        ticker = threading.Thread(target=self.tick, name="code-sandbox progress", daemon=True)
        if self.on_stderr is not None:
            ticker.start()
        try:
            code = self._start(watch)
        finally:
            deadline.cancel()
            self.finished.set()
        duration_ms = int((time.monotonic() - self.started) * 1000)
        if ticker.is_alive():
            ticker.join()
        self.flush(force=True)  # the last pieces go out before the cleanup, as the runner's do
        with self.lock:
            killer = self.killer
        if killer is not None:
            killer.join(KILL_SECONDS + 1)
        self.clean_up()
        return self.answer(code, duration_ms, before, self.transport.usage(self.target))

    def _start(self, watch: WatchRequest) -> int | None:
        """The engine's watch, started again (nothing ran) while the runtime refuses to start the program."""
        for pause in START_RETRY_PAUSES:
            try:
                return self.transport.engine.watch_exec(self.target.container, watch)
            except NotStarted:
                time.sleep(pause)
        return self.transport.engine.watch_exec(self.target.container, watch)

    def answer(self, code: int | None, duration_ms: int, before: Usage | None, after: Usage | None) -> RunAnswer:
        if code is None or not 0 <= code <= 255:
            raise HelperCrash(cause="the engine reported no exit code for the program")
        killed = self.killed is not None and code == SIGKILL_EXIT
        timed_out = (killed and self.killed == "deadline") or duration_ms > self.request.timeout_ms
        stdout, stderr = bytes(self.kept[STDOUT]), bytes(self.kept[STDERR])
        return RunAnswer(
            ok=True,
            stdout_b64=base64.b64encode(stdout).decode(),
            stderr_b64=base64.b64encode(stderr).decode(),
            stdout_bytes=self.counts[STDOUT],
            stderr_bytes=self.counts[STDERR],
            stdout_truncated=self.counts[STDOUT] > self.caps[STDOUT],
            stderr_truncated=self.counts[STDERR] > self.caps[STDERR],
            duration_ms=duration_ms,
            cleanup="failed" if self.kill_unfinished else "ok",  # a late kill must not meet the next call
            leftover_killed=self.leftover,
            cpu_ms=cpu_ms(before, after),
            peak_memory_bytes=peak_memory(before, after),
            exit_code=None if killed else code,
            signal="SIGKILL" if killed else None,
            timed_out=timed_out,
            oom_killed=False,
            oom_detectable=False,
        )

    def output(self, stream: int, piece: bytes) -> None:
        """From the reading thread: count, keep up to the cap, kill past it, stream what was kept."""
        with self.lock:
            before = self.counts[stream]
            self.counts[stream] = before + len(piece)
            room = max(self.caps[stream] - before, 0)
            if room:
                kept = piece[:room]
                self.kept[stream].extend(kept)
                self.unsent[stream] += len(kept)
            over = self.counts[stream] > self.caps[stream]
        if over:
            self.kill("stdout" if stream == STDOUT else "stderr")
        self.flush(force=False)

    def exited(self) -> None:
        """From the engine's watcher: the program ended while something it started holds its streams open."""
        self.clean_up()

    def kill(self, reason: str) -> None:
        with self.lock:
            if self.killed is not None or self.finished.is_set():
                return
            self.killed = reason
            self.killer = threading.Thread(target=self.end_all, daemon=True)
            self.killer.start()

    def end_all(self) -> None:
        if not self.transport.end_all(self.target):
            self.kill_unfinished = True

    def clean_up(self) -> None:
        """Once per run: count what is left of the sandbox uid (the program's leftovers, unless the host killed it),
        then end it all. A survey that cannot answer here proves nothing either way: the kill goes ahead, and the
        survey after the run decides."""
        with self.cleanup_lock:
            if self.cleaned:
                return
            self.cleaned = True
            alive = self._leftovers()
            if self.killed is None and alive is not None:
                self.leftover = alive
            # Again while the survey still finds some: a kill-all started while leftovers held every task of the
            # uid may not have started.
            for _attempt in range(KILL_ATTEMPTS):
                if alive == 0:
                    break
                self.end_all()
                alive = self._leftovers()
                if alive != 0:  # the kill-all itself may still be on its way out
                    time.sleep(SETTLE_SECONDS)
                    alive = self._leftovers()

    def _leftovers(self) -> int | None:
        try:
            return self.transport.leftovers(self.target)
        except SandboxError:
            return None

    def tick(self) -> None:
        while not self.finished.wait(PROGRESS_MS / 1000):
            with self.lock:
                line = Progress(
                    elapsed_ms=int((time.monotonic() - self.started) * 1000),
                    stdout_bytes=self.counts[STDOUT],
                    stderr_bytes=self.counts[STDERR],
                )
            self.emit(line.model_dump_json().encode())
            self.flush(force=False)

    def flush(self, *, force: bool) -> None:
        """Stream kept output as pieces, at most one per stream per :data:`PIECE_MS` or :data:`PIECE_BYTES`."""
        if self.on_stderr is None or not self.request.stream:
            return
        now = time.monotonic()
        names: tuple[tuple[int, Literal["stdout", "stderr"]], ...] = ((STDOUT, "stdout"), (STDERR, "stderr"))
        for stream, name in names:
            with self.lock:
                due = force or self.unsent[stream] >= PIECE_BYTES or now - self.sent_at[stream] >= PIECE_MS / 1000
                if not self.unsent[stream] or not due:
                    continue
                data = bytes(self.kept[stream][len(self.kept[stream]) - self.unsent[stream] :])
                self.unsent[stream] = 0
                self.sent_at[stream] = now
            piece = OutputPiece(stream=name, b64=base64.b64encode(data).decode())
            self.emit(piece.model_dump_json().encode())

    def emit(self, line: bytes) -> None:
        sink: Callable[[bytes], None] | None = self.on_stderr
        if sink is not None:
            with self.emit_lock:
                sink(line + b"\n")


def cpu_ms(before: Usage | None, after: Usage | None) -> int | None:
    """The sandbox's CPU time over the run as the engine counts it (gVisor's own kernel included)."""
    if before is None or after is None or after.cpu_ns < before.cpu_ns:
        return None
    return (after.cpu_ns - before.cpu_ns) // 1_000_000


def peak_memory(before: Usage | None, after: Usage | None) -> int | None:
    """The run's peak above what the sandbox held before it, where the run set a new high-water mark (the engine
    keeps no other); ``None`` otherwise."""
    if before is None or after is None or before.memory_peak_bytes is None or after.memory_peak_bytes is None:
        return None
    if after.memory_peak_bytes <= before.memory_peak_bytes:
        return None
    return max(after.memory_peak_bytes - before.memory_bytes, 0)


def transport_for(engine: Engine, profile: Profile) -> ChannelTransport:
    """The transport of the runtime in force (see :class:`RuntimeTransport`).

    :raises SandboxError: the engine cannot say.
    """
    model = engine.runtime_in_force().trust_model(
        jailed_runs=profile.info.jailed_runs, architecture=engine.daemon_facts().architecture
    )
    transport = {"sealed helpers": ChannelTransport, "jailed runs": JailedTransport, "engine-only": EngineOnlyTransport}
    return transport[model](engine, profile)


class RuntimeTransport(Transport):
    """The transport for the runtime the engine runs sandboxes under, chosen at first use (the engine may not answer
    when the server starts): :class:`ChannelTransport` under the sealed-helpers trust model; under gVisor
    :class:`JailedTransport` where the profile's runner and the engine's machine have the jail, else
    :class:`EngineOnlyTransport`."""

    def __init__(self, engine: Engine, profile: Profile) -> None:
        self.engine = engine
        self.profile = profile
        self._chosen: ChannelTransport | None = None
        self._lock = threading.Lock()

    @property
    def chosen(self) -> ChannelTransport:
        """The transport in force; asks the engine for its runtime the first time.

        :raises SandboxError: the engine cannot say (not reachable, or no such runtime).
        """
        with self._lock:
            if self._chosen is None:
                self._chosen = transport_for(self.engine, self.profile)
            return self._chosen

    def files(
        self, target: Target, request: FileRequest, answer: type[M], *, payload: Iterable[bytes] = (), timeout: float
    ) -> M | Refusal:
        return self.chosen.files(target, request, answer, payload=payload, timeout=timeout)

    def run(
        self, target: Target, request: RunRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> RunAnswer | Refusal:
        return self.chosen.run(target, request, timeout=timeout, on_stderr=on_stderr)

    def execute(
        self,
        target: Target,
        request: ExecuteRequest,
        *,
        payload: Iterable[bytes],
        timeout: float,
        on_stderr: StderrSink | None = None,
    ) -> ExecuteAnswer | Refusal:
        return self.chosen.execute(target, request, payload=payload, timeout=timeout, on_stderr=on_stderr)

    def supports_evaluation(self) -> bool:
        return self.chosen.supports_evaluation()

    def supports_warm_pool(self) -> bool:
        return self.chosen.supports_warm_pool()

    def evaluate(
        self, target: Target, request: EvaluateRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> EvaluateAnswer | Refusal:
        return self.chosen.evaluate(target, request, timeout=timeout, on_stderr=on_stderr)

    def pack(self, target: Target, request: PackRequest, *, timeout: float) -> tuple[PackAnswer, bytes] | Refusal:
        return self.chosen.pack(target, request, timeout=timeout)

    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        return self.chosen.kill_all(target, timeout=timeout)

    def survey(self, target: Target, *, timeout: float) -> SurveyAnswer | Refusal:
        return self.chosen.survey(target, timeout=timeout)

    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        return self.chosen.watchdog_ready(target, timeout=timeout)

    def prepare(self, target: Target) -> None:
        self.chosen.prepare(target)

    def rest(self, target: Target) -> None:
        if self._chosen is not None:
            self._chosen.rest(target)

    def close(self, container: str) -> None:
        if self._chosen is not None:
            self._chosen.close(container)

    def close_all(self) -> None:
        if self._chosen is not None:
            self._chosen.close_all()
