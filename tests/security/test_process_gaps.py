"""Gaps in process supervision (issue 32): a process whose leader thread exited, a paused evaluation context that is
continued between calls, and a program that stops the runner's memory sampler."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import time
from collections.abc import Generator
from contextlib import contextmanager, suppress

import anyio
import pytest
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.engine import Engine, ExecRequest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import PROBE_UID, user_of
from code_sandbox.sandbox.evaluation import evaluate_code
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.supervision import verify_cleanup
from code_sandbox.sandbox.workspace import list_files, write_files

from tests.security.conftest import jailed
from tests.support.inspect import docker_of

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

# x86-64: clone(CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM) a thread that pauses forever,
# then exit (SYS_exit, not exit_group) in the leader thread: what pthread_exit in main does. The leader shows as a
# zombie while the process lives on in the other thread.
_LEADER_EXITS_CODE = bytes.fromhex(
    "b838000000 bf000f0500"  # mov eax, 56 (clone); mov edi, 0x50f00
    "31f6 31d2 4531d2 4531c0 0f05"  # no stack, tids or tls; syscall
    "85c0 7409"  # test eax, eax; jz thread
    "b83c000000 31ff 0f05"  # mov eax, 60 (exit); xor edi, edi; syscall
    "b822000000 0f05 ebf7"  # thread: mov eax, 34 (pause); syscall; jmp thread
)
_LEADER_EXITS_PATH = "/leader-exits"


def _leader_exits_executable() -> bytes:
    """A static ELF executable of one read-only, executable segment: headers, then the code."""
    base, headers = 0x400000, 64 + 56
    size = headers + len(_LEADER_EXITS_CODE)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)  # 64-bit, little-endian, version 1
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 62, 1, base + headers, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # PT_LOAD, R+X
    return ehdr + phdr + _LEADER_EXITS_CODE


# Processes of one uid whose leader is a zombie while the group still has other threads, seen by a uid of no sandbox.
_ZOMBIE_LEADERS = """
const fs = require('fs');
console.log(JSON.stringify(fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p)).filter((p) => {
  try { const s = fs.readFileSync(`/proc/${p}/status`, 'latin1');
        return +s.match(/Uid:\\s+(\\d+)/)[1] === UID && s.match(/State:\\s+(\\S)/)[1] === 'Z' &&
               +s.match(/Threads:\\s+(\\d+)/)[1] > 1; } catch { return false; } }).map(Number)));
"""


def _zombie_leaders(engine: Engine, session: Session) -> list[int]:
    argv = ["/usr/local/bin/node", "-e", _ZOMBIE_LEADERS.replace("UID", str(session.uid))]
    result = engine.exec(session.container_id, ExecRequest(argv, user=user_of(PROBE_UID), timeout=30, max_stdout=65536))
    assert result.exit_code == 0, result.stderr
    return list(json.loads(result.stdout))


@contextmanager
def leader_exited(engine: Engine, session: Session, image_id: str) -> Generator[str]:
    """A process of the sandbox's uid in its pid namespace whose leader thread exited while another thread lives.

    Nothing in the sandbox image can make one (node never ends its main thread alone, and every writable mount is
    noexec), but another runtime's image could (pthread_exit in main), so it is started from outside: a container of
    our own that joins the sandbox's pid namespace as its uid. Yields that container's ID; removed afterwards.
    """
    if engine.daemon_facts().architecture != "x86_64":
        pytest.skip("the probe is x86-64 code")
    api = docker_of(engine).client()
    config = api.create_host_config(pid_mode=f"container:{session.container_id}", network_mode="none")
    created = api.create_container(
        image_id, entrypoint=[_LEADER_EXITS_PATH], command=[], user=session.user, labels=dict(engine.labels),
        host_config=config,
    )  # fmt: skip
    container = str(created["Id"])
    try:
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            member = tarfile.TarInfo(_LEADER_EXITS_PATH.lstrip("/"))
            member.size, member.mode = len(_leader_exits_executable()), 0o755
            tar.addfile(member, io.BytesIO(_leader_exits_executable()))
        api.put_archive(container, "/", archive.getvalue())
        api.start(container)
        deadline = time.monotonic() + 30
        while not _zombie_leaders(engine, session):
            assert time.monotonic() < deadline, "the probe never showed a zombie leader with a live thread"
            time.sleep(0.1)
        yield container
    finally:
        with suppress(SandboxError):
            engine.remove_container(container)


@pytest.mark.runc_only(
    "the probe joins the sandbox's pid namespace from a container of its own, which gVisor does not allow"
)
async def test_a_process_whose_leader_thread_exited_is_counted_by_the_survey(
    manager: SessionManager, image_id: str
) -> None:
    # Between calls nothing of the sandbox's uid may live but its channel: the supervisor's survey must count this one
    # (its /proc/<pid> says "zombie"; /proc/<pid>/task still lists the live thread) and destroy the sandbox.
    session = await manager.create()
    await write_files(manager, session.id, [("a.txt", "a")], overwrite=False)  # the channel is open
    with leader_exited(manager.provisioner.engine, session, image_id), pytest.raises(SandboxError) as caught:
        async with manager.channel(session.id) as channel:
            await verify_cleanup(channel)
    assert caught.value.code == ErrorCode.PROCESS_CLEANUP_FAILED
    assert len(manager) == 0 and manager.provisioner.engine.container_facts(session.container_id) is None


@pytest.mark.runc_only(
    "the probe joins the sandbox's pid namespace from a container of its own, which gVisor does not allow"
)
async def test_a_process_whose_leader_thread_exited_is_killed_and_counted_by_the_runs_cleanup(
    manager: SessionManager, image_id: str
) -> None:
    # The runner's cleanup kills every process of the uid with kill(-1), which reaches this one too; its scan, which
    # proves the kill, must see it (counted, and waited for until it is gone) rather than take it for dead.
    session = await manager.create()
    await write_files(manager, session.id, [("main.js", "console.log('ran')")], overwrite=False)
    with leader_exited(manager.provisioner.engine, session, image_id) as probe:
        result = await run_entrypoint(manager, session.id, "main.js", [], timeout_seconds=10)
        assert (result.exit_code, result.stdout) == (0, "ran\n")
        assert result.leftover_processes_killed == 1
        deadline = time.monotonic() + 10  # the engine learns of its process's death a moment later
        while (facts := manager.provisioner.engine.container_facts(probe)) is not None and facts.state == "running":
            assert time.monotonic() < deadline, "the probe outlived the run's cleanup"
            await anyio.sleep(0.1)
        assert facts is not None and facts.state == "exited"
        assert _zombie_leaders(manager.provisioner.engine, session) == []


# Whether /proc/<p> is a process of the exec's own uid (in a program where ``fs`` is ``require('fs')``).
_OF_UID = "(() => { try { return +fs.readFileSync(`/proc/${p}/status`, 'latin1').match(/Uid:\\s+(\\d+)/)[1] === process.getuid(); } catch { return false; } })()"

# The context counts while it runs (and has counted before it is paused); its pid says where to send the signal.
_TICKING = (
    "globalThis.ticks = 0; setInterval(() => ticks++, 5); await new Promise((r) => setTimeout(r, 50)); process.pid"
)


_NO_TRACE_UNDER_GVISOR = pytest.mark.runc_only(
    "a context continued and stopped again on less than 10 ms of CPU leaves no trace under gVisor, whose /proc has no "
    "schedstat and counts CPU time in 10 ms ticks (SECURITY.md, jailed runs: evaluation)"
)


@pytest.mark.parametrize(
    ("stopped_again", "next_call"),
    [
        (False, "evaluate"),
        pytest.param(True, "evaluate", marks=_NO_TRACE_UNDER_GVISOR),
        pytest.param(True, "list_files", marks=_NO_TRACE_UNDER_GVISOR),
    ],
    ids=["left-running", "stopped-again", "stopped-again-then-a-file-call"],
)
async def test_a_paused_context_that_was_continued_between_calls_gets_the_sandbox_destroyed(
    manager: SessionManager, stopped_again: bool, next_call: str
) -> None:
    # No code in the sandbox can send the paused context a delayed SIGCONT (node has no POSIX timers, and no other
    # process of the uid outlives a call), so the test sends it as the sandbox uid from outside, the way such a
    # signal would: the context runs for a moment, and may be stopped again, so that its state alone looks paused.
    session = await manager.create()
    first = await evaluate_code(manager, session.id, _TICKING, timeout_seconds=10, reset=False)
    await write_files(manager, session.id, [("a.txt", "a")], overwrite=False)  # a file call leaves it paused
    second = await evaluate_code(manager, session.id, "ticks > 0 && process.pid", timeout_seconds=10, reset=False)
    assert second.value == first.value and second.context_reset is False, (first, second)
    # The context's pid as an exec sees it: jailed (gVisor), the one it reported is its namespace's, so the exec
    # signals every other process of its uid, which there is the context alone.
    pid = first.value or "0"
    if jailed(manager):
        pid = f"(require('fs').readdirSync('/proc').find((p) => /^\\d+$/.test(p) && +p !== process.pid && {_OF_UID}) || 'none')"
    again = f"process.kill({pid}, 'SIGSTOP');" if stopped_again else ""
    script = f"const fs = require('fs'); process.kill({pid}, 'SIGCONT'); setTimeout(() => {{ {again} }}, 300);"
    argv = runtime_argv(manager.provisioner.engine, manager.provisioner.profile, ["/usr/local/bin/node", "-e", script])
    sent = manager.provisioner.engine.exec(
        session.container_id, ExecRequest(argv, user=session.user, timeout=30, max_stdout=1024)
    )
    assert sent.exit_code == 0, sent.stderr
    with pytest.raises(SandboxError) as caught:
        if next_call == "evaluate":
            await evaluate_code(manager, session.id, "ticks", timeout_seconds=10, reset=False)
        else:
            await list_files(manager, session.id, "", recursive=False, max_depth=1)
    assert "destroyed" in caught.value.message
    assert len(manager) == 0 and manager.provisioner.engine.container_facts(session.container_id) is None


# Stops the runner (and its memory sampler) while a child holds 150 MB, and continues it once the child is gone.
_HIDDEN_PEAK = """
const { execFileSync } = require('child_process');
process.kill(process.ppid, 'SIGSTOP');
try { execFileSync(process.execPath, ['-e', 'Buffer.alloc(150e6, 1)']); } finally { process.kill(process.ppid, 'SIGCONT'); }
"""


@pytest.mark.runc_only(
    "stops the runner's memory sampler: under gVisor user code cannot name the runner, let alone signal it (jailed "
    "runs), or no runner samples (engine-only)"
)
async def test_a_program_that_stops_the_memory_sampler_cannot_hide_its_peak(manager: SessionManager) -> None:
    # The first run sets the sandbox's high-water mark, so that the second one's peak sets no new one: only samples
    # could show it, and the runner takes none while it is stopped.
    session = await manager.create()
    files = [
        ("mark.js", "const held = Buffer.alloc(300e6, 1); setTimeout(() => console.log(held.length), 300);"),
        ("hide.js", _HIDDEN_PEAK),
        ("hello.js", "console.log('hello')"),
    ]
    await write_files(manager, session.id, files, overwrite=False)
    mark = await run_entrypoint(manager, session.id, "mark.js", [], timeout_seconds=30)
    assert mark.exit_code == 0 and mark.peak_memory_bytes is not None and mark.peak_memory_bytes >= 300_000_000
    hidden = await run_entrypoint(manager, session.id, "hide.js", [], timeout_seconds=30)
    assert hidden.exit_code == 0, hidden.stderr
    assert hidden.peak_memory_bytes is not None and hidden.peak_memory_bytes >= 150_000_000, hidden.peak_memory_bytes
    # A run that leaves the sampler alone is still measured by its samples, not by the earlier mark.
    hello = await run_entrypoint(manager, session.id, "hello.js", [], timeout_seconds=30)
    assert hello.peak_memory_bytes is not None and hello.peak_memory_bytes < 100_000_000, hello.peak_memory_bytes
