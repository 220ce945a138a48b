"""The real transports with one helper's raw answer edited: faults that no honest helper produces on demand (a
garbled answer, a flood of lines), injected at the bytes the host parses, around a real container.

:class:`EditedTransport` edits answers on the session's channel (file operations and runs, as the server sends
them); :class:`EditedExecTransport` edits exec results (the exec form, where an exit code exists). Install either
with :func:`install`, which closes the channels the manager's previous transport held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from code_sandbox.engine import DockerEngine, ExecResult, HeldExec
from code_sandbox.profile import Profile
from code_sandbox.sessions import SessionManager
from code_sandbox.transport import ChannelTransport, DockerTransport, StderrSink, Target, Transport

LineEdit = Callable[[bytes, StderrSink | None], bytes]
"""Gets the helper's answer line and the stderr sink (to feed it lines); returns the line the host is to see."""
ExecEdit = Callable[[list[str], ExecResult, StderrSink | None], ExecResult]


class EditedTransport(ChannelTransport):
    """The channel transport; the answer to every request of ``operation`` (``"run"``, ``"list"``...) is edited.
    ``operations`` records the operation of every request sent."""

    def __init__(self, engine: DockerEngine, profile: Profile, operation: str, edit: LineEdit) -> None:
        super().__init__(engine, profile)
        self._operation = operation
        self._edit = edit
        self.operations: list[str] = []

    def _read_answer(
        self,
        operation: str,
        held: HeldExec,
        deadline: float,
        max_stdout: int,
        max_stderr: int,
        on_stderr: StderrSink | None,
    ) -> bytes:
        self.operations.append(operation)
        line = super()._read_answer(operation, held, deadline, max_stdout, max_stderr, on_stderr)
        return self._edit(line, on_stderr) if operation == self._operation else line


class EditedExecTransport(DockerTransport):
    """The exec transport; every exec whose argv ``match`` accepts gets its result edited."""

    def __init__(
        self, engine: DockerEngine, profile: Profile, match: Callable[[list[str]], bool], edit: ExecEdit
    ) -> None:
        super().__init__(engine, profile)
        self._match = match
        self._edit = edit

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
        result = super()._exec(
            target, argv, stdin=stdin, timeout=timeout, max_stdout=max_stdout, max_stderr=max_stderr,
            on_stderr=on_stderr,
        )  # fmt: skip
        return self._edit(argv, result, on_stderr) if self._match(argv) else result


def install(manager: SessionManager, transport: Transport) -> None:
    """Make ``transport`` the manager's, closing what the previous one held (its sandboxes' channels)."""
    manager.provisioner.transport.close_all()
    manager.provisioner.transport = transport


def is_run(argv: list[str]) -> bool:
    """A run in the exec form (``runner -``), not ``--kill-all``, ``--survey`` or ``--watchdog-ready``."""
    return any(arg.endswith("runner.mjs") for arg in argv) and argv[-1] == "-"
