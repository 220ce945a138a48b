"""An in-memory sandbox behind the typed transport, for unit tests of the workspace and run logic without Docker.

:class:`MemoryTransport` keeps a workspace in a dict and answers runs from a script; a test can also make the next
call fail the way a broken helper would. :class:`MemorySandboxes` hands out its channel the way
``SessionManager.channel`` does and records what fail-closed destroyed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import struct
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field

from code_sandbox.channel.guard import Channel
from code_sandbox.channel.protocol import (
    DigestRequest,
    KillAllAnswer,
    ListRequest,
    M,
    ReadRequest,
    ReadyAnswer,
    Refusal,
    RunAnswer,
    RunRequest,
    SurveyAnswer,
    UnpackRequest,
    WriteHeader,
    WriteRequest,
)
from code_sandbox.channel.transport import FileRequest, StderrSink, Target, Transport
from code_sandbox.errors import ErrorCode, SandboxError


def run_answer(**changes: object) -> RunAnswer:
    """A runner answer for a program that printed ``hi`` and exited 0, with ``changes`` applied."""
    fields: dict[str, object] = {
        "ok": True, "exit_code": 0, "signal": None, "timed_out": False,
        "stdout_b64": base64.b64encode(b"hi\n").decode(), "stderr_b64": "", "stdout_bytes": 3, "stderr_bytes": 0,
        "stdout_truncated": False, "stderr_truncated": False, "oom_killed": False, "oom_detectable": True,
        "duration_ms": 5, "cleanup": "ok", "leftover_killed": 0, "cpu_ms": 3, "peak_memory_bytes": 4096,
    }  # fmt: skip
    return RunAnswer.model_validate({**fields, **changes})


@dataclass
class MemoryTransport(Transport):
    workspace: dict[str, bytes] = field(default_factory=dict[str, bytes])
    runs: list[RunRequest] = field(default_factory=list[RunRequest])
    calls: list[str] = field(default_factory=list[str])
    answer_run: Callable[[RunRequest], RunAnswer | Refusal] = lambda _request: run_answer()
    survivors: int | None = 0
    """What the survey counts; ``None`` makes it fail to answer."""
    failure: Exception | None = None
    """Raised by the next call instead of answering (a crash, a timeout, a vanished container)."""
    edit_answer: Callable[[dict[str, object]], dict[str, object]] | None = None
    """Rewrites the next file answer before it is validated, as a lying helper would."""
    on_kill_all: Callable[[], None] = lambda: None

    def _fail_if_told(self, name: str) -> None:
        self.calls.append(name)
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def files(
        self, target: Target, request: FileRequest, answer: type[M], *, payload: Iterable[bytes] = (), timeout: float
    ) -> M | Refusal:
        self._fail_if_told(type(request).__name__)
        reply = self._file_operation(request, b"".join(payload))
        if self.edit_answer is not None:
            reply, self.edit_answer = self.edit_answer(reply), None
        if reply.get("ok") is False:
            return Refusal.model_validate(reply)
        return answer.model_validate(reply)

    def _file_operation(self, request: FileRequest, payload: bytes) -> dict[str, object]:
        if isinstance(request, WriteRequest):
            (length,) = struct.unpack(">I", payload[:4])
            header = WriteHeader.model_validate_json(payload[4 : 4 + length])
            data, results = payload[4 + length :], list[str]()
            for entry in header.files:
                content, data = data[: entry.size], data[entry.size :]
                if entry.path in self.workspace and not request.overwrite:
                    results.append("exists")
                    continue
                results.append("overwritten" if entry.path in self.workspace else "written")
                self.workspace[entry.path] = content
            return {"ok": True, "results": results, "entries": len(self.workspace), "bytes": self._bytes()}
        if isinstance(request, ListRequest):
            rows = [{"path": path, "type": "file", "size": len(data)} for path, data in sorted(self.workspace.items())]
            return {"ok": True, "entries": rows, "truncated": False}
        if isinstance(request, ReadRequest | DigestRequest):
            if request.path not in self.workspace:
                return {"ok": False, "code": "NOT_FOUND", "message": "the path does not exist"}
            data = self.workspace[request.path]
            if isinstance(request, DigestRequest):
                return {"ok": True, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            kept = data[: request.max_bytes]
            content = base64.b64encode(kept).decode() if request.encoding == "base64" else kept.decode()
            return {"ok": True, "content": content, "size": len(data), "truncated": len(data) > request.max_bytes}
        if isinstance(request, UnpackRequest):
            return {"ok": False, "code": "NOT_SUPPORTED", "message": "no snapshots in memory"}
        # A DeleteRequest: every other kind is answered above.
        statuses = ["deleted" if self.workspace.pop(path, None) is not None else "missing" for path in request.paths]
        return {"ok": True, "results": statuses}

    def _bytes(self) -> int:
        return sum(len(data) for data in self.workspace.values())

    def run(
        self, target: Target, request: RunRequest, *, timeout: float, on_stderr: StderrSink | None = None
    ) -> RunAnswer | Refusal:
        self._fail_if_told("run")
        self.runs.append(request)
        if on_stderr is not None:
            on_stderr(json.dumps({"elapsed_ms": 1, "stdout_bytes": 3, "stderr_bytes": 0}).encode() + b"\n")
        return self.answer_run(request)

    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        self._fail_if_told("kill_all")
        self.on_kill_all()
        return KillAllAnswer(ok=True, killed=0, cleanup="ok")

    def survey(self, target: Target, *, timeout: float) -> SurveyAnswer | Refusal:
        self.calls.append("survey")
        if self.survivors is None:
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the survey did not answer")
        return SurveyAnswer(ok=True, alive=self.survivors)

    def watchdog_ready(self, target: Target, *, timeout: float) -> ReadyAnswer | Refusal:
        self._fail_if_told("watchdog_ready")
        return ReadyAnswer(ok=True, ready=True)


@dataclass
class MemorySandboxes:
    """One sandbox, ``"only"``, served over a :class:`MemoryTransport`; records what fail-closed destroyed."""

    transport: MemoryTransport = field(default_factory=MemoryTransport)
    seconds_left: float = 3600.0
    destroyed: list[ErrorCode] = field(default_factory=list[ErrorCode])
    leases: int = 0

    @contextlib.asynccontextmanager
    async def channel(self, session_id: str) -> AsyncGenerator[Channel]:
        if session_id != "only" or self.destroyed:
            raise SandboxError(ErrorCode.INVALID_SESSION, "no such sandbox")
        self.leases += 1
        yield Channel(self.transport, Target("memory", "10000:10000"), self._fail_closed, self.seconds_left, "memory")

    async def _fail_closed(self, error: SandboxError) -> SandboxError:
        self.destroyed.append(error.code)
        return error
