"""The real Docker transport with one helper's raw result edited: faults that no honest helper produces on demand
(a garbled answer, a flood of lines), injected at the bytes the host parses, around a real container."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from code_sandbox.engine import DockerEngine, ExecResult
from code_sandbox.profile import Profile
from code_sandbox.transport import DockerTransport, StderrSink, Target

Edit = Callable[[list[str], ExecResult, StderrSink | None], ExecResult]
"""Gets the helper's argv, what the real helper returned, and the stderr sink (to feed it lines); returns what the
host is to see instead."""


class EditedTransport(DockerTransport):
    def __init__(self, engine: DockerEngine, profile: Profile, match: Callable[[list[str]], bool], edit: Edit) -> None:
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


def is_run(argv: list[str]) -> bool:
    """A run (``runner -``), not ``--kill-all``, ``--survey`` or ``--watchdog-ready``."""
    return any(arg.endswith("runner.mjs") for arg in argv) and argv[-1] == "-"


def is_file_operation(operation: str) -> Callable[[list[str]], bool]:
    return lambda argv: any(arg.endswith("files.mjs") for arg in argv) and operation in argv
