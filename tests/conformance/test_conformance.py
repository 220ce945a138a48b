"""What every runtime profile must do, checked against each profile in the repository on a real Docker engine.

A profile passes when its image, argv and helpers give the same behaviour through core: files, runs and their
results, limits, timeouts, cancellation, cleanup, and the basic confinement seen from inside.
"""

from __future__ import annotations

import base64
import json
from functools import partial

import anyio
import pytest
from code_sandbox.channel.protocol import ExecuteRequest, Refusal, RunRequest
from code_sandbox.channel.transport import Target
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import OUTPUT_CAP_BYTES
from code_sandbox.sandbox.execution import prepare_program, run_entrypoint, run_prepared
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.workspace import (
    PreparedWrite,
    delete_files,
    list_files,
    prepare_write,
    read_file,
    write_files,
)

from tests.conformance.programs import Programs
from tests.security.conftest import jailed
from tests.support.output import on_first_output

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]


async def run(
    sandboxes: SessionManager, session_id: str, programs: Programs, source: str, *arguments: str, seconds: int = 10
) -> RunResult:
    name = f"program{programs.suffix}"
    await write_files(sandboxes, session_id, [(name, source)], overwrite=True)
    return await run_entrypoint(sandboxes, session_id, name, list(arguments), timeout_seconds=seconds)


async def test_files_are_written_listed_read_and_deleted(sandboxes: SessionManager) -> None:
    session = await sandboxes.create()
    files = [("a.txt", "alpha"), ("src/deep/b.txt", "βeta\n")]
    assert await write_files(sandboxes, session.id, files, overwrite=False) == ["written", "written"]
    assert await write_files(sandboxes, session.id, [("a.txt", "new")], overwrite=False) == ["exists"]
    entries, truncated = await list_files(sandboxes, session.id, "", recursive=True, max_depth=10)
    assert [(e.path, e.type) for e in entries] == [
        ("a.txt", "file"), ("src", "directory"), ("src/deep", "directory"), ("src/deep/b.txt", "file")
    ]  # fmt: skip
    assert truncated is False
    read = await read_file(sandboxes, session.id, "src/deep/b.txt", max_bytes=4)
    assert (read.content, read.size, read.truncated) == ("βet", 6, True)  # never a cut character
    assert await delete_files(sandboxes, session.id, ["a.txt", "a.txt", "src"]) == ["deleted", "missing", "not_a_file"]
    with pytest.raises(SandboxError) as caught:
        await read_file(sandboxes, session.id, "a.txt", max_bytes=10)
    assert caught.value.code == ErrorCode.NOT_FOUND


async def test_a_run_gets_its_arguments_verbatim_and_returns_output_and_exit_code(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.arguments, "a b", "$(x)", "'q'", "")
    assert (result.exit_code, result.signal, result.termination_reason) == (3, None, "exited")
    assert (result.stdout, result.stderr) == ("a b|$(x)|'q'|\n", "err\n")


async def test_files_a_program_writes_persist_for_later_calls(sandboxes: SessionManager, programs: Programs) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.make_file)
    assert result.exit_code == 0, result.stderr
    assert (await read_file(sandboxes, session.id, "out/result.txt", max_bytes=100)).content == "made by the program"


async def test_output_past_the_cap_is_cut_and_reported(sandboxes: SessionManager, programs: Programs) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.flood)
    assert result.termination_reason == "OUTPUT_LIMIT_EXCEEDED" and result.stdout_truncated is True
    assert result.stdout == "x" * OUTPUT_CAP_BYTES and result.stderr_truncated is False


async def test_a_program_past_its_timeout_is_killed_and_the_sandbox_keeps_working(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.forever, seconds=1)
    assert result.timed_out is True and result.termination_reason == "timed_out"
    assert 1000 <= result.duration_ms < 5000
    again = await run(sandboxes, session.id, programs, programs.arguments, "next")
    assert again.stdout == "next\n"


async def test_a_cancelled_run_stops_at_once_and_the_sandbox_keeps_working(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    name = f"forever{programs.suffix}"
    await write_files(sandboxes, session.id, [(name, programs.forever)], overwrite=False)
    started = anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:

            async def call() -> None:
                await run_entrypoint(
                    sandboxes, session.id, name, [], timeout_seconds=30, output=on_first_output(started)
                )

            group.start_soon(call)
            await started.wait()
            group.cancel_scope.cancel()
    assert len(sandboxes) == 1  # the kill was verified: the sandbox stays
    again = await run(sandboxes, session.id, programs, programs.arguments, "after")
    assert again.stdout == "after\n"


async def test_processes_a_program_leaves_behind_are_killed_and_the_sandbox_keeps_working(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.detach)
    assert result.exit_code == 0, result.stderr
    assert result.leftover_processes_killed >= 1
    assert len(sandboxes) == 1  # the supervisor's survey found nothing left


async def test_inside_there_is_no_network_no_writable_root_no_capability_and_no_way_to_signal_the_watchdog(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.probe)
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert set(seen["interfaces"]) <= {"lo"} and seen["connect"] is False
    assert seen["root_write"] is False
    assert int(seen["cap_eff"], 16) == 0
    # A jailed run cannot even name the watchdog: its /proc lists its own namespace.
    assert seen["kill_watchdog"] == ("unseen" if jailed(sandboxes) else "EPERM")


async def test_a_delete_stopped_midway_by_permissions_the_program_set_destroys_the_sandbox(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.lock)
    assert result.exit_code == 0, result.stderr
    await write_files(sandboxes, session.id, [("a.txt", "a")], overwrite=False)
    # a.txt goes, then locked/b.txt is refused: the workspace is no longer what the client was told, so it goes.
    with pytest.raises(SandboxError) as caught:
        await delete_files(sandboxes, session.id, ["a.txt", "locked/b.txt"])
    assert caught.value.code == ErrorCode.PERMISSION_DENIED and "destroyed" in caught.value.message
    assert len(sandboxes) == 0


async def test_a_program_that_changes_its_runners_priority_changes_no_later_run(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    result = await run(sandboxes, session.id, programs, programs.renice)
    if not sandboxes.provisioner.engine.runtime_in_force().user_space_kernel:
        # Same uid: the kernel lets a program renice (or prlimit) the runner that lives on between runs, and every
        # later program would inherit it. The runner notices before its next request and ends; the sandbox goes.
        assert result.exit_code == 0, result.stderr
        with pytest.raises(SandboxError) as caught:
            await list_files(sandboxes, session.id, "", recursive=False, max_depth=1)
        assert "destroyed" in caught.value.message
        assert len(sandboxes) == 0
        return
    # Under gVisor the program's parent lives for that run alone: the jail's init, or no process of ours (engine-only:
    # each run is an exec of its own). gVisor's kernel lets a uid set any niceness it can name (and schedules by
    # none), so the renice may succeed; the next run still starts at the usual priority.
    assert result.exit_code in (0, 1), result.stderr
    assert (await run(sandboxes, session.id, programs, programs.nice)).stdout.strip() == "0"


async def test_destroy_removes_the_container_and_the_session(sandboxes: SessionManager) -> None:
    session = await sandboxes.create()
    assert await sandboxes.destroy(session.id) is True
    assert sandboxes.provisioner.engine.container_facts(session.container_id) is None
    with pytest.raises(SandboxError) as caught:
        await list_files(sandboxes, session.id, "", recursive=False, max_depth=1)
    assert caught.value.code == ErrorCode.INVALID_SESSION


async def test_a_one_shot_writes_its_files_and_runs_in_one_request(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    name = f"program{programs.suffix}"
    files = prepare_write([(name, programs.make_file), ("data/in.txt", "input")], overwrite=False)
    program = prepare_program(sandboxes, name, [], timeout_seconds=10)
    result = await run_prepared(sandboxes, session.id, program, files=files)
    assert result.exit_code == 0, result.stderr
    assert (await read_file(sandboxes, session.id, "out/result.txt", max_bytes=100)).content == "made by the program"
    assert (await read_file(sandboxes, session.id, "data/in.txt", max_bytes=100)).content == "input"


async def test_a_one_shot_whose_write_is_refused_runs_nothing(sandboxes: SessionManager, programs: Programs) -> None:
    session = await sandboxes.create()
    name = f"program{programs.suffix}"
    checked = prepare_write([(name, programs.make_file)], overwrite=False)
    # A path no honest host sends (the host's own check would refuse it first): the helper refuses the write.
    files = PreparedWrite(checked.request, [*checked.files, ("../escape.txt", b"out")])
    program = prepare_program(sandboxes, name, [], timeout_seconds=10)
    run = RunRequest(argv=program.argv, timeout_ms=10_000, stdout_cap=1024, stderr_cap=1024, stream=False)
    call = partial(
        sandboxes.provisioner.transport.execute,
        Target(session.container_id, session.user),
        ExecuteRequest(write=files.request, run=run),
        payload=files.payload(),
        timeout=30,
    )
    answer = await anyio.to_thread.run_sync(call)
    assert isinstance(answer, Refusal) and answer.code in ("PATH_TRAVERSAL", "INVALID_PATH")
    with pytest.raises(SandboxError) as missing:
        await read_file(sandboxes, session.id, "out/result.txt", max_bytes=100)  # on a channel opened anew
    assert missing.value.code == ErrorCode.NOT_FOUND


async def test_a_one_shot_refused_by_its_helper_destroys_its_sandbox(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    name = f"program{programs.suffix}"
    checked = prepare_write([(name, programs.make_file)], overwrite=False)
    files = PreparedWrite(checked.request, [*checked.files, ("../escape.txt", b"out")])
    program = prepare_program(sandboxes, name, [], timeout_seconds=10)
    with pytest.raises(SandboxError) as caught:
        await run_prepared(sandboxes, session.id, program, files=files)
    assert caught.value.code in (ErrorCode.PATH_TRAVERSAL, ErrorCode.INVALID_PATH)
    assert "destroyed" in caught.value.message and len(sandboxes) == 0


async def test_a_run_reports_the_cpu_time_and_peak_memory_its_cgroup_counted(
    sandboxes: SessionManager, programs: Programs
) -> None:
    session = await sandboxes.create()
    # Engine-only (gVisor, a profile that does not jail): the engine's host-side counters, which need not match the
    # second gVisor tells the program it used, and which keep a peak only where a run set a new high-water mark.
    # Jailed runs read gVisor's own counters in the sandbox, as the runner reads the cgroup's under runc.
    engine_counters = sandboxes.provisioner.engine.runtime_in_force().user_space_kernel and not jailed(sandboxes)
    busy = await run(sandboxes, session.id, programs, programs.busy)
    assert busy.exit_code == 0 and busy.cpu_ms is not None, busy
    assert (300 if engine_counters else 800) <= busy.cpu_ms <= 3000, busy
    hold = await run(sandboxes, session.id, programs, programs.hold)
    assert hold.exit_code == 0, hold.stderr
    # 200 MB written, against the sandbox's use just before (which counts the next run's waiting process, whose
    # pages the run then reuses): within a few pages of it, never far below.
    assert hold.peak_memory_bytes is not None and hold.peak_memory_bytes >= 199_000_000, hold
    hello = await run(sandboxes, session.id, programs, programs.arguments)
    if engine_counters:
        assert hello.peak_memory_bytes is None
    else:
        assert hello.peak_memory_bytes is not None and hello.peak_memory_bytes < 100_000_000
    assert hello.cpu_ms is not None and hello.cpu_ms < 800


async def test_any_bytes_are_written_and_read_back_as_base64_and_refused_as_text(sandboxes: SessionManager) -> None:
    session = await sandboxes.create()
    data = bytes(range(256)) * 3
    assert await write_files(sandboxes, session.id, [("blob.bin", data)], overwrite=False) == ["written"]
    whole = await read_file(sandboxes, session.id, "blob.bin", max_bytes=4096, encoding="base64")
    assert (base64.b64decode(whole.content), whole.size, whole.truncated, whole.image_type) == (data, 768, False, None)
    cut = await read_file(sandboxes, session.id, "blob.bin", max_bytes=5, encoding="base64")
    assert (base64.b64decode(cut.content), cut.truncated) == (data[:5], True)
    with pytest.raises(SandboxError) as caught:
        await read_file(sandboxes, session.id, "blob.bin", max_bytes=4096)
    assert caught.value.code == ErrorCode.BINARY_FILE
