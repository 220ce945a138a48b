"""run_javascript's engine: every way a program can end, against the real image."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from code_sandbox.channel.transport import StderrSink
from code_sandbox.engine import ExecRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.sandbox import execution
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.supervision import HOST_GRACE_SECONDS
from code_sandbox.sandbox.workspace import list_files, write_files

from tests.support.edited_transport import EditedTransport, install
from tests.support.output import on_first_output

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]
MiB = 1024 * 1024

COUNT_LEFTOVERS = """
const fs = require('fs');
const mine = fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p) && +p !== process.pid && +p !== process.ppid)
  .filter(p => { try { const s = fs.readFileSync(`/proc/${p}/status`, 'utf8');
    return +s.match(/Uid:\\s+(\\d+)/)[1] === process.getuid() && !/State:\\s+Z/.test(s); } catch { return false; } });
console.log(mine.length);
"""


@pytest.fixture
async def session(manager: SessionManager) -> Session:
    return await manager.create()


async def run(manager: SessionManager, session: Session, source: str, **kwargs: Any) -> RunResult:
    name = kwargs.pop("name", "main.js")
    await write_files(manager, session.id, [(name, source)], overwrite=True)
    return await run_entrypoint(
        manager, session.id, name, kwargs.pop("arguments", []), timeout_seconds=kwargs.pop("timeout", None), **kwargs
    )


async def test_a_normal_run_returns_output_and_exit_code_zero(manager: SessionManager, session: Session) -> None:
    result = await run(manager, session, "console.log('hi'); console.error('warn')")
    assert (result.exit_code, result.signal, result.timed_out, result.termination_reason) == (0, None, False, "exited")
    assert (result.stdout, result.stderr) == ("hi\n", "warn\n")
    assert result.duration_ms > 0


async def test_a_non_zero_exit_code_is_returned(manager: SessionManager, session: Session) -> None:
    result = await run(manager, session, "process.exit(3)")
    assert result.exit_code == 3 and result.termination_reason == "exited"


async def test_an_uncaught_exception_exits_1_with_the_stack_on_stderr(
    manager: SessionManager, session: Session
) -> None:
    result = await run(manager, session, "throw new Error('boom')")
    assert result.exit_code == 1
    assert "Error: boom" in result.stderr


async def test_a_program_killed_by_a_signal_reports_it(manager: SessionManager, session: Session) -> None:
    result = await run(manager, session, "process.kill(process.pid, 'SIGKILL')")
    assert (result.exit_code, result.signal, result.termination_reason) == (None, "SIGKILL", "signaled")
    assert result.oom_killed is False


async def test_a_busy_loop_times_out_at_its_deadline(manager: SessionManager, session: Session) -> None:
    started = time.monotonic()
    result = await run(manager, session, "for(;;){}", timeout=1)
    # Killed by the runner at its deadline (measured in the container), long before the host's backstop.
    assert 1000 <= result.duration_ms < 3000, result.duration_ms
    assert time.monotonic() - started < 1 + HOST_GRACE_SECONDS
    assert result.timed_out is True and result.termination_reason == "timed_out"
    assert (await run(manager, session, "console.log('next')")).stdout == "next\n"  # the session is still usable


async def test_stdout_beyond_1_mib_is_cut_and_flagged(manager: SessionManager, session: Session) -> None:
    result = await run(manager, session, "const s='x'.repeat(65536); for(let i=0;i<80;i++) process.stdout.write(s)")
    assert len(result.stdout.encode()) == MiB
    assert result.stdout_truncated is True and result.stderr_truncated is False
    assert result.termination_reason == "OUTPUT_LIMIT_EXCEEDED"


async def test_stderr_beyond_1_mib_is_cut_and_flagged(manager: SessionManager, session: Session) -> None:
    result = await run(manager, session, "process.stderr.write(Buffer.alloc(3*1024*1024, 65))")
    assert len(result.stderr) == MiB and result.stderr_truncated is True


async def test_a_heap_bomb_ends_in_oom_or_a_clean_v8_abort_and_the_session_stays_usable(
    manager: SessionManager, session: Session
) -> None:
    result = await run(manager, session, "const a=[]; for(;;){ a.push(Buffer.alloc(16*1024*1024, 1)); }", timeout=30)
    assert result.oom_killed or result.signal in ("SIGABRT", "SIGTRAP") or result.exit_code not in (0, None)
    if result.oom_killed:
        assert result.signal == "SIGKILL" and result.termination_reason == "oom_killed"
    follow_up = await run(manager, session, "console.log('alive')")
    assert follow_up.stdout == "alive\n"


async def test_invalid_utf8_output_comes_back_with_replacement_characters(
    manager: SessionManager, session: Session
) -> None:
    result = await run(manager, session, "process.stdout.write(Buffer.from([0x61, 0xff, 0xfe, 0x62, 0xe2, 0x82]))")
    assert result.stdout == "a\ufffd\ufffdb\ufffd"


async def test_arguments_reach_the_program_verbatim_without_a_shell(manager: SessionManager, session: Session) -> None:
    arguments = ["a b", "$(id)", "'\"", "; rm -rf /", "é😀", "--flag=1", ""]
    result = await run(manager, session, "console.log(JSON.stringify(process.argv.slice(2)))", arguments=arguments)
    assert json.loads(result.stdout) == arguments


async def test_the_largest_allowed_arguments_reach_the_program(manager: SessionManager, session: Session) -> None:
    # 32 arguments of 4096 bytes are more than the kernel allows in one argv string; requests go over stdin.
    arguments = [chr(0x41 + i % 26) * 4096 for i in range(31)] + ["ж" * 2048]
    result = await run(
        manager, session, "console.log(process.argv.slice(2).map(a => a.length).join(','))", arguments=arguments
    )
    assert result.stdout.strip() == ",".join(["4096"] * 31 + ["2048"])


async def test_a_run_near_the_end_of_the_lifetime_times_out_instead_of_failing(
    manager: SessionManager, session: Session
) -> None:
    # The host cuts a run's timeout to what is left of the session's lifetime (``Session.deadline``, host-side),
    # so the run ends before the container's watchdog, which fires a grace period after that deadline. The cut is
    # the host's alone: the session is moved to 3 s before its deadline instead of being waited through.
    session.deadline = manager.clock() + 3
    result = await run(manager, session, "setTimeout(() => {}, 60000)", timeout=20)
    assert result.timed_out is True and result.duration_ms < 4000


KILL_THE_CHANNEL = """
const fs = require('fs');
for (const p of fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p) && Number(p) !== process.pid)) {
  try { if (fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('--channel')) process.kill(Number(p), 'SIGKILL'); }
  catch {}
}
"""


async def test_a_channel_that_died_between_calls_destroys_the_sandbox_at_the_next_call(
    manager: SessionManager, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    await write_files(manager, session.id, [("a.txt", "a")], overwrite=False)  # the channel is open now
    # Killed from outside any run (a second exec as the sandbox uid), as the kernel's OOM killer might.
    argv = ["/usr/local/bin/node", "-e", KILL_THE_CHANNEL]
    killer = manager.provisioner.engine.exec(
        session.container_id, ExecRequest(argv, user=session.user, timeout=30, max_stdout=1024)
    )
    assert killer.exit_code == 0
    with pytest.raises(SandboxError) as caught:
        await list_files(manager, session.id, ".", recursive=True, max_depth=1)
    assert caught.value.code == ErrorCode.TRANSFER_FAILED and "destroyed" in caught.value.message
    assert len(manager) == 0
    [logged] = [record.getMessage() for record in caplog.records if "a helper failed" in record.getMessage()]
    assert logged.endswith(": a helper failed (the channel to the sandbox closed); it is destroyed"), logged


async def test_a_garbled_runner_answer_destroys_the_session(manager: SessionManager, session: Session) -> None:
    install(manager, _edited_runner_answer(manager, lambda answer: answer.pop("stdout_b64")))
    with pytest.raises(SandboxError) as caught:
        await run(manager, session, "console.log(1)")
    assert caught.value.code == ErrorCode.SUPERVISOR_FAILED
    assert len(manager) == 0


async def test_entrypoint_suffix_and_argument_limits_are_enforced(manager: SessionManager, session: Session) -> None:
    cases: list[tuple[str, list[str], int | None, ErrorCode]] = [
        ("main.py", [], None, ErrorCode.INVALID_PATH),
        ("../main.js", [], None, ErrorCode.PATH_TRAVERSAL),
        ("main.js", ["x"] * 33, None, ErrorCode.INVALID_REQUEST),
        ("main.js", ["x" * 4097], None, ErrorCode.INVALID_REQUEST),
        ("main.js", ["a\x00b"], None, ErrorCode.INVALID_REQUEST),
        ("main.js", [], 0, ErrorCode.INVALID_REQUEST),
        ("main.js", [], 61, ErrorCode.INVALID_REQUEST),
    ]
    for entrypoint, arguments, timeout, code in cases:
        with pytest.raises(SandboxError) as caught:
            await run_entrypoint(manager, session.id, entrypoint, arguments, timeout_seconds=timeout)
        assert caught.value.code == code, (entrypoint, code)


async def test_progress_is_reported_during_a_long_run(manager: SessionManager, session: Session) -> None:
    updates: list[tuple[float, int]] = []

    async def progress(elapsed: float, output_bytes: int) -> None:
        updates.append((elapsed, output_bytes))

    source = "let n=0; const t=setInterval(() => { console.log('tick'); if (++n === 5) clearInterval(t); }, 500)"
    await run(manager, session, source, progress=progress)
    assert len(updates) >= 2
    assert updates[-1][0] >= 1.0 and updates[-1][1] > 0


async def test_a_cancelled_run_frees_the_session_quickly_and_others_are_served(
    manager: SessionManager, session: Session
) -> None:
    other = await manager.create()
    source = "console.log('running'); setTimeout(() => {}, 60000)"
    await write_files(manager, session.id, [("slow.js", source)], overwrite=False)
    served_during: list[float] = []
    freed_after: list[float] = []
    running = anyio.Event()

    async def cancelled_run(scope: anyio.CancelScope) -> None:
        with scope:
            await run_entrypoint(
                manager, session.id, "slow.js", [], timeout_seconds=60, output=on_first_output(running)
            )

    scope = anyio.CancelScope()
    cancelled_at = float("inf")
    async with anyio.create_task_group() as group:
        group.start_soon(cancelled_run, scope)
        with anyio.fail_after(30):
            await running.wait()
        # The run lasts 60 s; "quickly" is anything far below that, however loaded the machine.
        started = time.monotonic()
        await list_files(manager, other.id, ".", recursive=True, max_depth=1)
        served_during.append(time.monotonic() - started)
        cancelled_at = time.monotonic()
        scope.cancel()
    await list_files(manager, session.id, ".", recursive=True, max_depth=1)  # needs the session's lease
    freed_after.append(time.monotonic() - cancelled_at)
    assert freed_after[0] < 10, freed_after
    assert served_during[0] < 10, served_during
    assert (await run(manager, session, COUNT_LEFTOVERS, name="count.js")).stdout == "0\n"


async def test_runs_in_two_sessions_overlap_in_time(manager: SessionManager, session: Session) -> None:
    other = await manager.create()
    spans: list[list[int]] = []

    async def timed(target: Session) -> None:
        # Each program reports when it ran, on the clock that every container shares with the host.
        result = await run(manager, target, "const t=Date.now(); while(Date.now()-t<3000){} console.log(t, Date.now())")
        spans.append([int(part) for part in result.stdout.split()])

    async with anyio.create_task_group() as group:
        group.start_soon(timed, session)
        group.start_soon(timed, other)
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end  # the intervals intersect: not one after the other


async def test_a_runner_that_stops_answering_is_caught_by_the_host_deadline(
    manager: SessionManager, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    # User code shares the runner's uid, so it can stop it: the host's safety net must destroy the sandbox. How long
    # the host waits past the run's deadline is not the subject here, so it waits 1 s instead of its usual grace.
    monkeypatch.setattr(execution, "HOST_GRACE_SECONDS", 1.0)
    started = time.monotonic()
    with pytest.raises(SandboxError) as caught:
        await run(manager, session, "process.kill(process.ppid, 'SIGSTOP'); setTimeout(() => {}, 60000)", timeout=1)
    assert caught.value.code == ErrorCode.TIMEOUT
    assert time.monotonic() - started < 1 + 1 + 10  # the deadline and the grace; the rest is a destroy under load
    assert manager.provisioner.engine.container_facts(session.container_id) is None


def _edited_runner_answer(manager: SessionManager, edit: Callable[[dict[str, Any]], None]) -> EditedTransport:
    """The runner's answer edited: faults no real program can force (cleanup failing) or that user code sharing
    the runner's uid could cause (a garbled answer)."""

    def edit_line(line: bytes, _on_stderr: StderrSink | None) -> bytes:
        answer = json.loads(line)
        edit(answer)
        return json.dumps(answer).encode()

    return EditedTransport(manager.provisioner.engine, manager.provisioner.profile, "run", edit_line)


async def test_failed_process_cleanup_destroys_the_session(manager: SessionManager, session: Session) -> None:
    install(manager, _edited_runner_answer(manager, lambda answer: answer.update(cleanup="failed")))
    with pytest.raises(SandboxError) as caught:
        await run(manager, session, "console.log(1)")
    assert caught.value.code == ErrorCode.PROCESS_CLEANUP_FAILED
    assert len(manager) == 0
