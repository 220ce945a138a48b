"""Commands run in a container: each exec created, attached, fed and read within one deadline, its exit code asked
of the engine (never of the process)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from code_sandbox.docker_engine import podman
from code_sandbox.docker_engine.answers import Created, ExecState
from code_sandbox.docker_engine.failures import APIError, NotFound, container_gone, translate
from code_sandbox.docker_engine.sdk import Client, attach_socket
from code_sandbox.docker_engine.streams import (
    HeldExec,
    close_stdin,
    close_stream,
    read_frames,
    relay_frames,
    send_all,
)
from code_sandbox.engine import ExecRequest, ExecResult, NotStarted, WatchRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import WORKSPACE_DIR

logger = logging.getLogger(__name__)

_UNAVAILABLE = (ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available")
EXIT_POLL_SECONDS = 0.1
"""How often a watched exec's state is asked of the engine while its streams are open."""


class Execs:
    """The execs of one engine object."""

    def __init__(
        self, client: Callable[[], Client], is_podman: Callable[[], bool], environment: Callable[[], dict[str, str]]
    ) -> None:
        self._client = client
        self._podman = is_podman
        self._environment = environment
        """Every exec's environment (:func:`code_sandbox.hardening.environment` for the runtime in force)."""

    def run(self, container_id: str, request: ExecRequest) -> ExecResult:
        """See :meth:`code_sandbox.engine.Engine.exec`. On Podman, whose exec API can lose a short command's whole
        output when busy (exit 0, nothing on either stream), a ``repeatable`` command without stdin runs again, up
        to :data:`~code_sandbox.docker_engine.podman.PODMAN_LOST_OUTPUT_RETRIES` times."""
        argv, stdin, exit_code = list(request.argv), request.stdin, request.exit_code
        deadline = time.monotonic() + request.timeout
        retries = podman.PODMAN_LOST_OUTPUT_RETRIES if request.repeatable and stdin is None and self._podman() else 0
        while True:
            exec_id, attached = self._start_exec(container_id, argv, user=request.user, stdin=stdin is not None)
            raw = attach_socket(attached)
            try:
                if stdin is not None:
                    send_all(raw, stdin, deadline)
                    close_stdin(raw)
                stdout, stderr = read_frames(raw, deadline, request.max_stdout, request.max_stderr, request.on_stderr)
            finally:
                close_stream(attached, raw)
            lost = retries > 0 and not stdout and not stderr
            code = self._exec_exit_code(exec_id, deadline) if exit_code or lost else None
            if not lost or code != 0:
                return ExecResult(exit_code=code if exit_code else None, stdout=stdout, stderr=stderr)
            retries -= 1
            logger.debug("the engine lost an exec's output; running it again")

    def watch(self, container_id: str, request: WatchRequest) -> int | None:
        """See :meth:`code_sandbox.engine.Engine.watch_exec`: the streams are read in this thread while another asks
        the engine, every :data:`EXIT_POLL_SECONDS`, whether the process has ended.

        An exec the runtime could not start carries the engine's own error on its stdout: so no output is handed on
        before the engine says the process started (asked once, at the first frame), and one that never started
        is an error, its stream read to the end and dropped.
        """
        exec_id, attached = self._start_exec(container_id, list(request.argv), user=request.user, stdin=False)
        raw = attach_socket(attached)
        done = threading.Event()
        gone = threading.Event()

        def end_reading() -> None:  # the container went: its streams may stay open (gVisor's do)
            gone.set()
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)

        watcher = threading.Thread(
            target=self._watch_exit, args=(exec_id, request, done, end_reading), name="code-sandbox exec watch",
            daemon=True,
        )  # fmt: skip
        watcher.start()
        started: list[bool] = []

        def hand_on(stream: int, piece: bytes) -> None:
            if not started:
                started.append(self._started(exec_id))
            if started[0]:
                request.on_output(stream, piece)

        try:
            relay_frames(raw, request.deadline, hand_on)
        except SandboxError:
            if not gone.is_set():
                raise
        finally:
            done.set()
            close_stream(attached, raw)
        if gone.is_set():
            raise container_gone()
        if not (started[0] if started else self._started(exec_id)):
            raise NotStarted
        return self._exec_exit_code(exec_id, max(request.deadline, time.monotonic() + 5))

    def _state(self, exec_id: str) -> ExecState:
        return ExecState.model_validate(self._client().exec_inspect(exec_id))

    def _started(self, exec_id: str) -> bool:
        with translate(*_UNAVAILABLE):
            try:
                state = self._state(exec_id)
            except NotFound:
                return False
        return bool(state.Pid) or state.Running is True

    def _watch_exit(
        self, exec_id: str, request: WatchRequest, done: threading.Event, end_reading: Callable[[], None]
    ) -> None:
        exited = False
        while not done.wait(EXIT_POLL_SECONDS):
            try:
                state = self._state(exec_id)
            except NotFound:  # the exec went with its container
                end_reading()
                return
            except Exception:
                return
            if not state.Running and state.Pid and not exited:  # ended, having started (a failed start has no pid)
                exited = True
                if not done.is_set():
                    request.on_exit()

    def open(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> HeldExec:
        """Start ``argv`` in the container with its stdin held open: requests go in, answers come back one line at
        a time, for as long as the process lives (the helpers' channel).

        :raises SandboxError: ``CONTAINER_UNAVAILABLE`` when the container or daemon is gone.
        """
        _exec_id, attached = self._start_exec(container_id, argv, user=user, stdin=True, privileged=privileged)
        return HeldExec(attached, attach_socket(attached))

    def _start_exec(
        self, container_id: str, argv: list[str], *, user: str, stdin: bool, privileged: bool = False
    ) -> tuple[str, object]:
        api = self._client()
        with translate(*_UNAVAILABLE):
            try:
                created = api.exec_create(
                    container_id, argv, stdout=True, stderr=True, stdin=stdin, tty=False, user=user,
                    environment=self._environment(), workdir=WORKSPACE_DIR, privileged=privileged,
                )  # fmt: skip
            except APIError as exc:
                if podman.not_running(exc, self._podman()):
                    raise container_gone() from None
                raise
            exec_id = Created.model_validate(created).Id
            attached: object = api.exec_start(exec_id, socket=True)
        return exec_id, attached

    def _exec_exit_code(self, exec_id: str, deadline: float) -> int | None:
        # The attach stream can end a moment before the daemon records the exit; poll briefly.
        with translate(*_UNAVAILABLE):
            while True:
                try:
                    state = self._state(exec_id)
                except NotFound:
                    return None
                if not state.Running:
                    return state.ExitCode
                if time.monotonic() > deadline:
                    raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not finish in time")
                time.sleep(0.01)
