"""The workspace and run logic over the typed transport, without Docker: an in-memory sandbox stands in.

What is checked here is core's side of the helper protocol: the requests it builds, how it judges answers, which
error each failure becomes, and that every untrustworthy outcome destroys the sandbox (through the channel's one
fail-closed path). The same behaviour against real helpers is in test_workspace.py, test_execution.py and
tests/security.
"""

from __future__ import annotations

import base64
import socket
import struct
import threading
import time
import zlib
from collections.abc import Awaitable, Callable

import anyio
import pytest
from code_sandbox.channel.channels import CLOSED_KEPT, ChannelTransport, read_answer
from code_sandbox.channel.protocol import Refusal, RunAnswer, RunRequest, SurveyAnswer
from code_sandbox.channel.transport import HelperCrash, StderrSink, Target
from code_sandbox.docker_engine.streams import HeldExec
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import OUTPUT_CAP_BYTES
from code_sandbox.profile import Profile
from code_sandbox.sandbox.execution import run_program
from code_sandbox.sandbox.pictures import MAX_BYTES, whole_picture_type
from code_sandbox.sandbox.relay import LAST_LINE_CHARS, LastLine
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.supervision import SURVEY_RETRY_PAUSES
from code_sandbox.sandbox.workspace import (
    delete_files,
    list_files,
    read_file,
    write_files,
)

from tests.support.digest import digest_file
from tests.support.memory_engine import MemoryEngine
from tests.support.memory_transport import MemorySandboxes, run_answer

pytestmark = pytest.mark.anyio


@pytest.fixture
def sandboxes() -> MemorySandboxes:
    return MemorySandboxes()


async def test_files_round_trip_through_the_typed_requests(sandboxes: MemorySandboxes) -> None:
    assert await write_files(sandboxes, "only", [("a.txt", "alpha"), ("src/b.txt", "βeta")], overwrite=False) == [
        "written",
        "written",
    ]
    assert await write_files(sandboxes, "only", [("a.txt", "new")], overwrite=False) == ["exists"]
    assert await write_files(sandboxes, "only", [("a.txt", "new")], overwrite=True) == ["overwritten"]
    entries, truncated = await list_files(sandboxes, "only", "", recursive=True, max_depth=10)
    assert [(e.path, e.size) for e in entries] == [("a.txt", 3), ("src/b.txt", 5)] and truncated is False
    read = await read_file(sandboxes, "only", "src/b.txt", max_bytes=100)
    assert (read.content, read.size, read.truncated) == ("βeta", 5, False)
    assert len(await digest_file(sandboxes, "only", "a.txt")) == 64
    assert await delete_files(sandboxes, "only", ["a.txt", "gone.txt"]) == ["deleted", "missing"]
    assert sandboxes.destroyed == []


async def test_invalid_input_is_refused_before_any_sandbox_is_leased(sandboxes: MemorySandboxes) -> None:
    attempts = [
        write_files(sandboxes, "only", [("../up.txt", "x")], overwrite=False),
        write_files(sandboxes, "only", [("a.txt", "x"), ("a.txt", "y")], overwrite=False),
        write_files(sandboxes, "only", [("big.txt", "x" * (2 * 1024 * 1024 + 1))], overwrite=False),
        list_files(sandboxes, "only", "", recursive=True, max_depth=11),
        read_file(sandboxes, "only", "a.txt", max_bytes=0),
        delete_files(sandboxes, "only", []),
    ]
    for attempt in attempts:
        with pytest.raises(SandboxError):
            await attempt
    assert sandboxes.leases == 0 and sandboxes.transport.calls == []


@pytest.mark.parametrize(
    ("helper_code", "expected"),
    [
        ("NOT_FOUND", ErrorCode.NOT_FOUND),
        ("PATH_TRAVERSAL", ErrorCode.PATH_TRAVERSAL),
        ("NOT_A_FILE", ErrorCode.INVALID_PATH),
        ("BINARY_FILE", ErrorCode.BINARY_FILE),
        ("WORKSPACE_LIMIT_EXCEEDED", ErrorCode.WORKSPACE_LIMIT_EXCEEDED),
    ],
)
async def test_a_helper_refusal_becomes_its_error_and_keeps_the_sandbox(
    sandboxes: MemorySandboxes, helper_code: str, expected: ErrorCode
) -> None:
    sandboxes.transport.edit_answer = lambda _answer: {"ok": False, "code": helper_code, "message": "no"}
    with pytest.raises(SandboxError) as caught:
        await read_file(sandboxes, "only", "a.txt", max_bytes=10)
    assert caught.value.code == expected
    assert sandboxes.destroyed == []


@pytest.mark.parametrize(
    ("refusal", "expected"),
    [
        ({"code": "WORKSPACE_INTEGRITY"}, ErrorCode.WORKSPACE_INTEGRITY),
        ({"code": "WORKSPACE_LIMIT_EXCEEDED", "partial": True}, ErrorCode.WORKSPACE_LIMIT_EXCEEDED),
        ({"code": "SOMETHING_NEW"}, ErrorCode.INTERNAL_ERROR),
    ],
    ids=["integrity", "partial-write", "unknown-code"],
)
async def test_a_refusal_that_leaves_the_workspace_untrusted_destroys_the_sandbox(
    sandboxes: MemorySandboxes, refusal: dict[str, object], expected: ErrorCode
) -> None:
    sandboxes.transport.edit_answer = lambda _answer: {"ok": False, "message": "no", **refusal}
    with pytest.raises(SandboxError) as caught:
        await write_files(sandboxes, "only", [("a.txt", "x")], overwrite=False)
    assert caught.value.code == expected and "destroyed" in caught.value.message
    assert sandboxes.destroyed == [expected]


async def test_a_per_path_answer_of_the_wrong_length_destroys_the_sandbox(sandboxes: MemorySandboxes) -> None:
    sandboxes.transport.edit_answer = lambda answer: {**answer, "results": ["deleted"]}
    with pytest.raises(SandboxError) as caught:
        await delete_files(sandboxes, "only", ["a.txt", "b.txt"])
    assert caught.value.code == ErrorCode.TRANSFER_FAILED
    assert sandboxes.destroyed == [ErrorCode.TRANSFER_FAILED]


@pytest.mark.parametrize(
    "edit",
    [
        {"content": "not base64!"},
        {"content": "AAEC", "size": 4},  # three bytes said to be the whole four-byte file
        {"content": "AAECAw==", "truncated": True},  # four bytes said to be a cut, but the whole file is four
    ],
)
async def test_a_base64_read_that_is_not_the_bytes_asked_for_destroys_the_sandbox(
    sandboxes: MemorySandboxes, edit: dict[str, object]
) -> None:
    await write_files(sandboxes, "only", [("b.bin", b"\x00\x01\x02\x03")], overwrite=False)
    sandboxes.transport.edit_answer = lambda answer: {**answer, **edit}
    with pytest.raises(SandboxError) as caught:
        await read_file(sandboxes, "only", "b.bin", max_bytes=10, encoding="base64")
    assert caught.value.code == ErrorCode.TRANSFER_FAILED
    assert sandboxes.destroyed == [ErrorCode.TRANSFER_FAILED]


# -- runs ----------------------------------------------------------------------------------------------------------


async def run(sandboxes: MemorySandboxes, *, timeout_seconds: int = 10) -> RunResult:
    async with sandboxes.channel("only") as channel:
        return await run_program(channel, ["/bin/program"], timeout_seconds=timeout_seconds)


async def test_a_run_sends_its_argv_caps_and_deadline_and_is_verified_by_a_survey(sandboxes: MemorySandboxes) -> None:
    result = await run(sandboxes, timeout_seconds=7)
    assert (result.exit_code, result.stdout, result.termination_reason) == (0, "hi\n", "exited")
    (request,) = sandboxes.transport.runs
    assert request == RunRequest(
        argv=["/bin/program"], timeout_ms=7000, stdout_cap=OUTPUT_CAP_BYTES, stderr_cap=OUTPUT_CAP_BYTES, stream=False
    )
    assert sandboxes.transport.calls == ["run", "survey"]


async def test_a_run_is_cut_to_what_is_left_of_the_sandboxs_lifetime(sandboxes: MemorySandboxes) -> None:
    sandboxes.seconds_left = 3.5
    await run(sandboxes, timeout_seconds=60)
    assert sandboxes.transport.runs[0].timeout_ms == 3000
    sandboxes.seconds_left = 0.5
    with pytest.raises(SandboxError) as caught:
        await run(sandboxes)
    assert caught.value.code == ErrorCode.SESSION_EXPIRED and sandboxes.destroyed == []


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"exit_code": None, "signal": "SIGKILL", "timed_out": True}, "timed_out"),
        ({"exit_code": None, "signal": "SIGKILL", "oom_killed": True}, "oom_killed"),
        ({"exit_code": None, "signal": "SIGSEGV"}, "signaled"),
        (
            {
                "stdout_bytes": OUTPUT_CAP_BYTES + 1,
                "stdout_truncated": True,
                "stdout_b64": base64.b64encode(b"x" * OUTPUT_CAP_BYTES).decode(),
            },
            "OUTPUT_LIMIT_EXCEEDED",
        ),
    ],
)
async def test_how_a_program_ended_becomes_its_termination_reason(
    sandboxes: MemorySandboxes, changes: dict[str, object], reason: str
) -> None:
    sandboxes.transport.answer_run = lambda _request: run_answer(**changes)
    result = await run(sandboxes)
    assert result.termination_reason == reason
    assert sandboxes.destroyed == []


async def test_a_run_that_lasted_past_its_timeout_timed_out_whatever_the_runner_says(
    sandboxes: MemorySandboxes,
) -> None:
    # A runner stopped by user code across the deadline sees only the exit; its duration gives it away.
    sandboxes.transport.answer_run = lambda request: run_answer(duration_ms=request.timeout_ms + 1)
    result = await run(sandboxes, timeout_seconds=2)
    assert (result.timed_out, result.termination_reason, result.exit_code) == (True, "timed_out", 0)
    sandboxes.transport.answer_run = lambda request: run_answer(duration_ms=request.timeout_ms)
    assert (await run(sandboxes, timeout_seconds=2)).termination_reason == "exited"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (run_answer(stdout_bytes=4), ErrorCode.SUPERVISOR_FAILED),  # counts disagree with the bytes
        (run_answer(stdout_b64="aGk=", stdout_truncated=True), ErrorCode.SUPERVISOR_FAILED),  # cut below the cap
        (run_answer(cleanup="failed"), ErrorCode.PROCESS_CLEANUP_FAILED),
        (Refusal(ok=False, code="SPAWN_FAILED", message="no"), ErrorCode.SUPERVISOR_FAILED),
    ],
    ids=["count-mismatch", "false-truncation", "cleanup-failed", "refusal"],
)
async def test_a_run_answer_that_cannot_be_trusted_destroys_the_sandbox(
    sandboxes: MemorySandboxes, answer: RunAnswer | Refusal, expected: ErrorCode
) -> None:
    sandboxes.transport.answer_run = lambda _request: answer
    with pytest.raises(SandboxError) as caught:
        await run(sandboxes)
    assert caught.value.code == expected
    assert sandboxes.destroyed == [expected]


@pytest.mark.parametrize("survivors", [1, None], ids=["survivor", "no-answer"])
async def test_a_survey_that_does_not_prove_zero_survivors_destroys_the_sandbox(
    sandboxes: MemorySandboxes, survivors: int | None
) -> None:
    sandboxes.transport.survivors = survivors
    with pytest.raises(SandboxError) as caught:
        await run(sandboxes)
    assert caught.value.code == ErrorCode.PROCESS_CLEANUP_FAILED
    assert sandboxes.destroyed == [ErrorCode.PROCESS_CLEANUP_FAILED]
    # A survey that could not answer is asked again (after pauses) before the verdict; a survivor counts at once.
    assert sandboxes.transport.calls.count("survey") == (1 + len(SURVEY_RETRY_PAUSES) if survivors is None else 1)


async def test_a_survey_that_answers_zero_on_a_later_attempt_lets_the_sandbox_live(
    sandboxes: MemorySandboxes, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers: list[int | None] = [None, None, 0]
    survey = sandboxes.transport.survey

    def recovering(target: Target, *, timeout: float) -> SurveyAnswer | Refusal:
        sandboxes.transport.survivors = answers.pop(0)
        return survey(target, timeout=timeout)

    monkeypatch.setattr(sandboxes.transport, "survey", recovering)
    await run(sandboxes)
    assert sandboxes.destroyed == [] and answers == []


async def list_root(sandboxes: MemorySandboxes) -> object:
    return await list_files(sandboxes, "only", "", recursive=False, max_depth=1)


@pytest.mark.parametrize(
    ("call", "failure", "expected"),
    [
        (list_root, HelperCrash(), ErrorCode.TRANSFER_FAILED),
        (list_root, SandboxError(ErrorCode.TIMEOUT, "slow"), ErrorCode.TIMEOUT),
        (list_root, SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "gone"), ErrorCode.CONTAINER_UNAVAILABLE),
        (run, HelperCrash(), ErrorCode.SUPERVISOR_FAILED),
        (run, SandboxError(ErrorCode.TIMEOUT, "slow"), ErrorCode.TIMEOUT),
        (run, SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "gone"), ErrorCode.CONTAINER_UNAVAILABLE),
    ],
    ids=["file-crash", "file-hang", "file-container-gone", "run-crash", "run-hang", "run-container-gone"],
)
async def test_a_broken_helper_call_destroys_the_sandbox_with_a_stable_code(
    sandboxes: MemorySandboxes,
    call: Callable[[MemorySandboxes], Awaitable[object]],
    failure: Exception,
    expected: ErrorCode,
) -> None:
    sandboxes.transport.failure = failure
    with pytest.raises(SandboxError) as caught:
        await call(sandboxes)
    assert caught.value.code == expected
    assert sandboxes.destroyed == [expected]
    with pytest.raises(SandboxError) as after:
        await list_root(sandboxes)
    assert after.value.code == ErrorCode.INVALID_SESSION


async def test_a_cancelled_run_is_killed_and_verified_and_the_sandbox_kept(sandboxes: MemorySandboxes) -> None:
    started, killed = threading.Event(), threading.Event()

    def slow_answer(_request: RunRequest) -> RunAnswer:
        started.set()
        killed.wait(10)  # the memory runner ends once killed, as a real one does
        return run_answer()

    sandboxes.transport.answer_run = slow_answer
    sandboxes.transport.on_kill_all = killed.set
    async with anyio.create_task_group() as group:
        group.start_soon(run, sandboxes)
        with anyio.fail_after(5):
            while not started.is_set():  # noqa: ASYNC110 - set by a worker thread
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    assert sandboxes.transport.calls == ["run", "kill_all", "survey"]
    assert sandboxes.destroyed == []


# -- the held stream ------------------------------------------------------------------------------------------------


def _answer(held: HeldExec, on_stderr: StderrSink) -> bytes:
    """The channel transport's reading of one answer, on a stream the test writes (a real socket pair)."""
    return read_answer(held, time.monotonic() + 5, 1 << 20, 1 << 20, on_stderr)


def _frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def test_an_answer_waits_for_stderr_that_dockerd_delivers_after_it(profile: Profile) -> None:
    # dockerd copies stdout and stderr separately: the last output piece of a run can arrive after its answer. It
    # belongs to that run, not to the next call on the channel.
    host, helper = socket.socketpair()
    with host, helper:
        helper.sendall(
            _frame(1, b'{"ok":true}\n') + _frame(2, b"late piece\n") + _frame(2, b'{"end":true}\n')
            + _frame(2, b"the next call's\n")
        )  # fmt: skip
        seen: list[bytes] = []
        line = _answer(HeldExec(host, host), seen.append)
        assert (line, seen) == (b'{"ok":true}', [b"late piece\n"])
        assert host.recv(1 << 16) == _frame(2, b"the next call's\n")  # left for the next call


def test_stdout_after_the_answer_or_stderr_after_the_end_marker_is_out_of_protocol(profile: Profile) -> None:
    for tail in (_frame(1, b"more\n"), _frame(2, b'{"end":true}\nmore\n')):
        host, helper = socket.socketpair()
        with host, helper:
            helper.sendall(_frame(1, b'{"ok":true}\n') + tail + _frame(2, b'{"end":true}\n'))
            with pytest.raises(SandboxError) as caught:
                _answer(HeldExec(host, host), lambda _line: None)
            assert caught.value.code == ErrorCode.TRANSFER_FAILED


class _HelloEngine(MemoryEngine):
    """An engine whose held execs of a channel are socket pairs whose far end has said a channel's hello; the
    supervisor's never opens and a one-off exec finds no container (the memory engine has none; neither is the
    subject)."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[socket.socket] = []

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> HeldExec:
        if "--supervise" in argv:
            raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "not in this test")
        host, helper = socket.socketpair()
        self.ends += [host, helper]
        helper.sendall(_frame(1, b'{"ok":true,"pid":7}\n'))
        return HeldExec(host, host)


def test_a_channel_for_a_closed_container_is_refused_and_only_recent_closes_are_remembered(profile: Profile) -> None:
    engine = _HelloEngine()
    transport = ChannelTransport(engine, profile)
    try:
        containers = [f"c{index}" for index in range(CLOSED_KEPT + 1)]
        for container in containers:
            transport.close(container)
        with pytest.raises(SandboxError) as caught:
            transport.prepare(Target(containers[-1], "1000:1000"))  # an opener that finished after the close
        assert caught.value.code == ErrorCode.CONTAINER_UNAVAILABLE
        transport.prepare(Target(containers[0], "1000:1000"))  # forgotten: the memory of closes stays bounded
    finally:
        transport.close_all()
        for end in engine.ends:
            end.close()


def test_prepare_opens_a_targets_first_channel_only(profile: Profile) -> None:
    engine = _HelloEngine()
    transport = ChannelTransport(engine, profile)
    target = Target("c", "1000:1000")
    try:
        transport.prepare(target)
        transport.prepare(target)  # open already: nothing more
        assert len(engine.ends) == 2
        with pytest.raises(SandboxError):
            transport.kill_all(target, timeout=1)  # drops the channel (the kill's exec finds no container)
        transport.prepare(target)  # a late prepare must not reopen what was dropped: the next call does that
        assert len(engine.ends) == 2
    finally:
        transport.close_all()
        for end in engine.ends:
            end.close()


async def test_the_last_output_line_is_quoted_cleaned_cut_and_marked_with_its_stream() -> None:
    last = LastLine()
    await last.feed("stdout", b"first\nsecond, partial")
    assert (last.stream, last.text) == ("stdout", "second, partial")
    await last.feed("stdout", b" line\n\n")
    assert last.text == "second, partial line"
    await last.feed("stderr", "\x1b[31mred\u202eevil\x07\n".encode())
    assert (last.stream, last.text) == ("stderr", "[31mred evil")  # no escape, no bidi override, no bell
    await last.feed("stdout", b"\xff" + b"x" * 499 + b"y")
    assert (last.stream, len(last.text), last.text[-2:]) == ("stdout", LAST_LINE_CHARS, "xy")  # its latest part
    await last.feed("stdout", b"\n 10%\r 20%\r 30%")
    assert last.text == "30%"  # a line redrawn with carriage returns: its last state
    await last.feed("stdout", "\nok\u2028FAKE second line\n".encode())
    assert last.text == "ok FAKE second line"  # a line separator cannot make it look like two lines
    await last.feed("stderr", b"\n\t\n")  # nothing to show: the last line stays
    assert last.stream == "stdout"


def _png(width: int, height: int, *, crc_ok: bool = True) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) ^ (0 if crc_ok else 1)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">II", width, height) + bytes([8, 2, 0, 0, 0])
    pixels = zlib.compress(b"\x00" * (1 + width * 3))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _jpeg(width: int, height: int, *, end: bytes = b"\xff\xd9") -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 4) + b"JF"
    frame = b"\xff\xc0" + struct.pack(">HBHH", 11, 8, height, width) + b"\x01\x01\x11\x00"
    return b"\xff\xd8" + app0 + frame + end


def _webp(width: int, height: int, *, size_delta: int = 0) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\x00" * 4 + (width - 1).to_bytes(3, "little")
    body += (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(body) + size_delta) + b"WEBP" + body


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_png(2, 1), "image/png"),
        (_png(2, 1, crc_ok=False), None),  # a chunk that does not hold together
        (_png(60000, 60000), None),  # well-formed, but a decompression bomb for whoever decodes it
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, None),  # only the signature
        (_jpeg(640, 480), "image/jpeg"),
        (_jpeg(640, 480, end=b""), None),
        (b"GIF89a" + struct.pack("<HH", 10, 10) + b"\x00" * 8 + b";", "image/gif"),
        (b"GIF87a" + struct.pack("<HH", 10, 10) + b"\x00" * 8, None),  # no trailer
        (_webp(100, 50), "image/webp"),
        (_webp(100, 50, size_delta=4), None),
        (b"RIFF\x00\x00", None),
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", None),
    ],
)
def test_a_picture_is_one_whose_structure_holds_and_whose_size_is_modest(data: bytes, expected: str | None) -> None:
    assert whole_picture_type(data, truncated=False) == expected
    assert whole_picture_type(data, truncated=True) is None  # cut: not a whole picture
    assert whole_picture_type(None, truncated=False) is None  # a text read


def test_a_picture_over_the_size_limit_is_not_returned_as_one() -> None:
    big = _png(2, 1)
    padded = big[:-12] + struct.pack(">I", MAX_BYTES) + b"tEXt" + b"\x00" * MAX_BYTES
    assert whole_picture_type(padded, truncated=False) is None


async def test_a_text_read_that_is_not_the_bytes_asked_for_destroys_the_sandbox(sandboxes: MemorySandboxes) -> None:
    await write_files(sandboxes, "only", [("t.txt", "hello")], overwrite=False)
    sandboxes.transport.edit_answer = lambda answer: {
        **answer,
        "content": "hello, and more than the file holds",
    }
    with pytest.raises(SandboxError) as caught:
        await read_file(sandboxes, "only", "t.txt", max_bytes=100)
    assert caught.value.code == ErrorCode.TRANSFER_FAILED
    assert sandboxes.destroyed == [ErrorCode.TRANSFER_FAILED]


class _ScriptedChannel(_HelloEngine):
    """A channel whose far end has said its hello (naming a waiting process) and then answers, in order, the lines
    given: what the host reads for each request it sends."""

    def __init__(self, hello: bytes, *answers: bytes) -> None:
        super().__init__()
        self.hello, self.answers = hello, answers

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> HeldExec:
        if "--supervise" in argv:
            raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "not in this test")
        host, helper = socket.socketpair()
        self.ends += [host, helper]
        helper.sendall(_frame(1, self.hello))
        for line in self.answers:
            helper.sendall(_frame(1, line) + _frame(2, b'{"end":true}\n'))
        return HeldExec(host, host)


def test_the_survey_spares_exactly_the_waiting_process_the_last_answer_named(profile: Profile) -> None:
    """The waiting process a hello announces is the one the next run uses: a run that opened the channel itself (racing
    the opener of a new sandbox, or after a kill-all) must not leave the host sparing it afterwards, as the process
    the program ran in; only the process the run's own answer announces is spared next."""
    hello = b'{"ok":true,"pid":7,"next_after":100}\n'
    plain = run_answer().model_dump_json().encode() + b"\n"
    named = run_answer(next_after=200).model_dump_json().encode() + b"\n"
    request = RunRequest(argv=["node", "x.js"], timeout_ms=1000, stdout_cap=10, stderr_cap=10, stream=False)
    engine = _ScriptedChannel(hello, plain, named)
    transport = ChannelTransport(engine, profile)
    target = Target("c", "1000:1000")
    try:
        assert isinstance(transport.run(target, request, timeout=5), RunAnswer)  # it opened the channel itself
        assert transport._survey_line(target) == b"7\n"  # pyright: ignore[reportPrivateUsage]
        assert isinstance(transport.run(target, request, timeout=5), RunAnswer)
        assert transport._survey_line(target) == b"7 >200\n"  # pyright: ignore[reportPrivateUsage]
    finally:
        transport.close_all()
        for end in engine.ends:
            end.close()
    engine = _ScriptedChannel(hello)
    transport = ChannelTransport(engine, profile)
    try:
        transport.prepare(target)
        assert transport._survey_line(target) == b"7 >100\n"  # pyright: ignore[reportPrivateUsage]
    finally:
        transport.close_all()
        for end in engine.ends:
            end.close()
