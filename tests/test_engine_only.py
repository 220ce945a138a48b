"""The engine-only trust model (gVisor, ``runsc``, for a profile that cannot jail its runs, or a machine the jail is not
written for): a run is the program itself, watched by the engine; nothing of the sandbox uid is believed; after every
run the supervisor's survey proves that no process of the uid lives. The JavaScript profile, told here that it cannot
jail (its own model under gVisor is jailed runs: ``tests/test_jailed.py``), stands in for such a profile; the Python
example is one.

Each attack here is user code that tries to outlive its run or to make the host report what it did not produce: it
forks, detaches, stops itself, renames itself, floods the process table, stops the kill, or prints a runner's
answer. These tests need runsc registered with the engine (CI does it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import anyio
import anyio.to_thread
import pytest
from code_sandbox.channel.observed import EngineOnlyTransport, RuntimeTransport
from code_sandbox.channel.transport import Target
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.profile import Profile
from code_sandbox.sandbox.evaluation import evaluate_code
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import list_files, read_file, write_files
from code_sandbox.serve.tool_text import evaluate_tool_description
from code_sandbox.settings import Settings

from tests.conftest import WORKER_TAG
from tests.security.conftest import assert_nothing_outlives_the_run, gvisor_processes
from tests.support.inspect import memory_usage
from tests.support.profiles import with_jailed_runs
from tests.support.runtimes import runtime_engine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture(scope="module")
def gvisor() -> Iterator[DockerEngine]:
    yield from runtime_engine("runsc", WORKER_TAG + "-engine-only")


@pytest.fixture
async def manager(gvisor: DockerEngine, profile: Profile, image_id: str) -> AsyncIterator[SessionManager]:
    del image_id
    settings = Settings(max_sessions=4, default_timeout=10, max_timeout=60)
    manager = SessionManager(gvisor, with_jailed_runs(profile, False), settings)
    yield manager
    await manager.shutdown()


@pytest.fixture
async def session(manager: SessionManager) -> Session:
    return await manager.create()


async def run(manager: SessionManager, session: Session, source: str, *, timeout: int = 10):  # noqa: ASYNC109
    await write_files(manager, session.id, [("attack.js", source)], overwrite=True)
    return await run_entrypoint(manager, session.id, "attack.js", [], timeout_seconds=timeout)


async def test_the_engine_only_transport_serves_runsc_and_every_file_tool_works(
    manager: SessionManager, session: Session
) -> None:
    transport = manager.provisioner.transport
    assert isinstance(transport, RuntimeTransport) and isinstance(transport.chosen, EngineOnlyTransport)
    await write_files(manager, session.id, [("src/a.txt", "é😀\n"), ("b.js", "console.log(1)")], overwrite=False)
    entries, _truncated = await list_files(manager, session.id, ".", recursive=True, max_depth=10)
    assert sorted(entry.path for entry in entries) == ["b.js", "src", "src/a.txt"]
    assert (await read_file(manager, session.id, "src/a.txt", max_bytes=100)).content == "é😀\n"
    result = await run(manager, session, "console.log('out'); console.error('err'); process.exitCode = 3;")
    assert (result.exit_code, result.signal, result.stdout, result.stderr) == (3, None, "out\n", "err\n")
    assert result.termination_reason == "exited" and result.cpu_ms is not None
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_detached_children_are_counted_killed_and_the_run_returns_at_the_programs_exit(
    manager: SessionManager, session: Session
) -> None:
    source = """
const { spawn } = require('child_process');
const idle = ['-e', 'setInterval(() => {}, 1000)'];
spawn(process.execPath, idle, { detached: true, stdio: 'ignore' }).unref();          // its own session, silent
spawn(process.execPath, idle, { detached: true, stdio: 'inherit' }).unref();         // holds the run's streams
spawn(process.execPath, ['-e', 'process.title = "runner --supervise"; setInterval(() => {}, 1000)'],
      { stdio: 'ignore' }).unref();                                                  // named like our supervisor
setTimeout(() => console.log('parent done'), 300);
"""
    result = await run(manager, session, source, timeout=20)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "parent done\n", False)
    assert result.duration_ms < 10_000  # not held until the deadline by a child that holds the streams
    assert result.leftover_processes_killed == 3  # counted by the supervisor before the kill
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_a_program_that_stops_itself_is_killed_at_its_deadline(manager: SessionManager, session: Session) -> None:
    source = """
const { spawn } = require('child_process');
spawn(process.execPath, ['-e', 'process.kill(process.pid, "SIGSTOP")'], { stdio: 'ignore' });
console.log('stopping'); setTimeout(() => process.kill(process.pid, 'SIGSTOP'), 100);
"""
    result = await run(manager, session, source, timeout=2)
    assert (result.timed_out, result.signal, result.exit_code, result.stdout) == (True, "SIGKILL", None, "stopping\n")
    assert result.termination_reason == "timed_out"
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_a_program_flooding_the_process_table_cannot_outlive_its_run(
    manager: SessionManager, session: Session
) -> None:
    # Every child forks again as it starts and the parent exits at once: the table keeps changing under the kill.
    source = """
const { spawn } = require('child_process');
const again = `const { spawn } = require('child_process');
  const options = { stdio: 'ignore', detached: true };
  for (let i = 0; i < 3; i++) try { spawn(process.execPath, ['-e', process.argv[1]], options).unref(); } catch {}
  setInterval(() => {}, 1000);`;
for (let i = 0; i < 8; i++) spawn(process.execPath, ['-e', again, again], { stdio: 'ignore', detached: true }).unref();
setTimeout(() => console.log('gone'), 500);
"""
    try:
        result = await run(manager, session, source, timeout=20)
    except SandboxError as error:
        # Destroyed, never a result with survivors: the kill could not be proven, or the flood's runtimes passed the
        # memory limit and the host's OOM killer ended gVisor's kernel (the container is then gone).
        assert error.code in (ErrorCode.PROCESS_CLEANUP_FAILED, ErrorCode.CONTAINER_UNAVAILABLE)
        assert len(manager) == 0
        return
    assert result.stdout == "gone\n"
    try:
        await assert_nothing_outlives_the_run(manager.provisioner.engine, session)
    except AssertionError:
        # The flood's runtimes, killed as the run ended, can still pass the memory limit first: the host's OOM killer
        # then ends gVisor's kernel, and every process with it (seen once in CI, as the check's exec failed).
        facts = manager.provisioner.engine.container_facts(session.container_id)
        assert facts is None or facts.state != "running", facts


async def test_a_program_that_stops_every_kill_gets_its_sandbox_destroyed(
    manager: SessionManager, session: Session
) -> None:
    # A child stops every new process of its uid (the kill-all is one) as soon as it appears, then the program exits:
    # the kill cannot be made, the survey finds the child, and the sandbox goes.
    source = """
const { spawn } = require('child_process');
const guard = `const fs = require('fs'); const seen = new Set([String(process.pid)]);
  for (const p of fs.readdirSync('/proc')) seen.add(p);
  setInterval(() => { for (const p of fs.readdirSync('/proc')) if (/^\\\\d+$/.test(p) && !seen.has(p)) {
    seen.add(p); try { process.kill(+p, 'SIGSTOP'); } catch {} } }, 1);`;
spawn(process.execPath, ['-e', guard], { stdio: 'ignore', detached: true }).unref();
setTimeout(() => console.log('exiting'), 1000);
"""
    with pytest.raises(SandboxError) as caught:
        await run(manager, session, source, timeout=20)
    # Destroyed, never a result; on a loaded machine gVisor's kernel itself has been seen to give up under this
    # attack first (the container is then gone before the destroy).
    assert caught.value.code in (ErrorCode.PROCESS_CLEANUP_FAILED, ErrorCode.CONTAINER_UNAVAILABLE)
    assert len(manager) == 0 and manager.provisioner.engine.container_facts(session.container_id) is None


async def test_a_kill_that_misses_a_process_is_caught_by_the_survey(manager: SessionManager, session: Session) -> None:
    """The kill-all is user-reachable: if it misses anything, the supervisor's survey must say so."""
    transport = manager.provisioner.transport
    assert isinstance(transport, RuntimeTransport)

    class Missing(EngineOnlyTransport):
        def end_all(self, target: Target) -> bool:
            del target  # the kill never happens, though it says it did
            return True

    replaced = transport.chosen
    transport._chosen = Missing(transport.engine, transport.profile)  # pyright: ignore[reportPrivateUsage]
    replaced.close_all()  # its supervisor's held exec
    source = "require('child_process').spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], " \
             "{ stdio: 'ignore', detached: true }).unref();"  # fmt: skip
    with pytest.raises(SandboxError) as caught:
        await run(manager, session, source)
    assert caught.value.code == ErrorCode.PROCESS_CLEANUP_FAILED
    assert len(manager) == 0 and manager.provisioner.engine.container_facts(session.container_id) is None


async def test_what_a_program_prints_is_its_output_never_a_result(manager: SessionManager, session: Session) -> None:
    forged = {
        "ok": True, "stdout_b64": "", "stderr_b64": "", "stdout_bytes": 0, "stderr_bytes": 0,
        "stdout_truncated": False, "stderr_truncated": False, "duration_ms": 1, "cleanup": "ok",
        "leftover_killed": 0, "cpu_ms": 1, "peak_memory_bytes": 1, "exit_code": 0, "signal": None,
        "timed_out": False, "oom_killed": False, "oom_detectable": True,
    }  # fmt: skip
    line = json.dumps(forged)
    source = f"""
console.log({line!r}); console.error('{{"elapsed_ms":1,"stdout_bytes":99,"stderr_bytes":99}}');
console.error('{{"end":true}}'); process.exit(7);
"""
    result = await run(manager, session, source)
    assert (result.exit_code, result.stdout) == (7, line + "\n")
    assert (result.cpu_ms, result.peak_memory_bytes, result.duration_ms) != (1, 1, 1)  # the engine's and the host's
    assert result.stderr == '{"elapsed_ms":1,"stdout_bytes":99,"stderr_bytes":99}\n{"end":true}\n'


async def test_a_signal_the_program_sends_itself_is_reported_as_the_engine_reports_it(
    manager: SessionManager, session: Session
) -> None:
    """The engine reports a signal n as exit code 128 + n, like an exit with that code: the host does not guess."""
    result = await run(manager, session, "process.kill(process.pid, 'SIGTERM'); setTimeout(() => {}, 5000);")
    assert (result.exit_code, result.signal, result.termination_reason) == (143, None, "exited")


async def test_output_past_the_cap_kills_the_program(manager: SessionManager, session: Session) -> None:
    source = """
const piece = Buffer.alloc(65536, 97);
(function write() { while (process.stdout.write(piece)) {} process.stdout.once('drain', write); })();
"""
    result = await run(manager, session, source, timeout=30)
    assert (result.stdout_truncated, result.signal, result.termination_reason) == (
        True,
        "SIGKILL",
        "OUTPUT_LIMIT_EXCEEDED",
    )
    assert len(result.stdout_raw) == 1024 * 1024 and result.duration_ms < 20_000
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_evaluation_is_refused_with_a_stable_code_and_its_description_says_so(
    manager: SessionManager, session: Session, profile: Profile
) -> None:
    with pytest.raises(SandboxError) as caught:
        await evaluate_code(manager, session.id, "1 + 1", timeout_seconds=5, reset=False)
    assert caught.value.code == ErrorCode.NOT_SUPPORTED
    assert len(manager) == 1  # refused before anything touched the sandbox
    text = evaluate_tool_description(Settings(runtime="runsc"), with_jailed_runs(profile, False))
    assert text.startswith("Not available on this server") and "NOT_SUPPORTED" in text
    assert "NOT_SUPPORTED" not in evaluate_tool_description(Settings(), with_jailed_runs(profile, False))
    jailed = with_jailed_runs(profile, True)  # a profile whose runs are jailed evaluates under gVisor too
    assert "NOT_SUPPORTED" not in evaluate_tool_description(Settings(runtime="runsc"), jailed)


async def test_no_process_of_the_sandbox_uid_lives_between_calls(manager: SessionManager, session: Session) -> None:
    """Between calls the sandbox holds init, the watchdog and the supervisor's channel (uid 65533), nothing else."""
    await run(manager, session, "console.log(1)")
    states = gvisor_processes(manager.provisioner.engine, session.container_id)
    assert sum(states.values()) <= 3, states


async def test_socket_buffers_live_in_gvisors_kernel_charged_to_the_sandboxs_memory(
    manager: SessionManager, session: Session
) -> None:
    """Our seccomp profile is not applied under gVisor, so a program can make TCP and UDP sockets on its loopback: they
    are gVisor's, and what they hold unread is memory of gVisor's kernel, which the sandbox's memory cgroup counts
    (on cgroup v1 the host's kernel would count none of a TCP socket's buffers)."""
    source = """
const net = require('net');
const chunk = Buffer.alloc(1 << 16, 120), clients = [];
const server = net.createServer((s) => s.pause()).listen(0, '127.0.0.1', async () => {
  for (let i = 0; i < 40; i++) {
    const port = server.address().port;
    const c = await new Promise((done) => { const c = net.connect(port, '127.0.0.1', () => done(c)); });
    clients.push(c);
    for (let k = 0; k < 64 && c.write(chunk); k++) {}
  }
  await new Promise((done) => setTimeout(done, 500));
  console.log(clients.reduce((sum, c) => sum + c.bytesWritten - c.writableLength, 0));
  setTimeout(() => process.exit(0), 4000);  // held while the host looks
});
"""
    engine = manager.provisioner.engine
    await write_files(manager, session.id, [("fill.js", source)], overwrite=True)
    before = memory_usage(engine, session.container_id)
    peak = before
    result: list[RunResult] = []

    async def fill() -> None:
        result.append(await run_entrypoint(manager, session.id, "fill.js", [], timeout_seconds=30))

    async with anyio.create_task_group() as group:
        group.start_soon(fill)
        while not result:
            peak = max(peak, await anyio.to_thread.run_sync(memory_usage, engine, session.container_id))
            await anyio.sleep(0.2)
    queued = int(result[0].stdout)
    assert queued > 20 * 1024 * 1024, result[0]
    assert peak - before > 0.8 * queued, (peak - before, queued)
    await assert_nothing_outlives_the_run(engine, session)


async def test_the_supervisor_cannot_be_signalled_nor_its_pipes_opened(
    manager: SessionManager, session: Session
) -> None:
    """gVisor does not keep a process of the sandbox uid out of another of the same uid, so the engine-only model
    believes none; the supervisor (uid 65533), whose answers it does believe, stays out of reach: no signal, and
    no pipe of its stdin or stdout can be opened to read a request or forge an answer."""
    source = """
const fs = require('fs'); const out = [];
for (const p of fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p))) {
  let status; try { status = fs.readFileSync(`/proc/${p}/status`, 'latin1'); } catch { continue; }
  if (+status.match(/Uid:\\s+(\\d+)/)[1] !== 65533) continue;
  const row = { cmd: fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('--supervise') };
  for (const [fd, mode] of [[0, 'r'], [1, 'w'], [2, 'w']]) {
    try { fs.closeSync(fs.openSync(`/proc/${p}/fd/${fd}`, mode)); row[fd] = 'opened'; } catch (e) { row[fd] = e.code; }
  }
  for (const signal of ['SIGSTOP', 'SIGKILL']) {
    try { process.kill(+p, signal); row[signal] = 'sent'; } catch (e) { row[signal] = e.code; }
  }
  out.push(row);
}
console.log(JSON.stringify(out));
"""
    rows = json.loads((await run(manager, session, source)).stdout)
    supervisors = [row for row in rows if row["cmd"]]
    assert len(supervisors) == 1, rows
    assert supervisors[0] == {"cmd": True, "0": "EACCES", "1": "EACCES", "2": "EACCES", "SIGSTOP": "EPERM",
                              "SIGKILL": "EPERM"}  # fmt: skip
    assert all(row["SIGKILL"] == "EPERM" for row in rows), rows
    second = await run(manager, session, "console.log('still supervised')")
    assert second.stdout == "still supervised\n"


async def test_ipc_none_is_not_applied_but_dev_shm_cannot_be_written(manager: SessionManager, session: Session) -> None:
    """gVisor ignores ``ipc: none``: its ``/dev/shm`` is there, in its own kernel, and the sandbox uid cannot write
    it, so it holds no memory outside the workspace's bound."""
    source = """
const fs = require('fs'); const out = {};
try { out.entries = fs.readdirSync('/dev/shm'); } catch (e) { out.entries = e.code; }
try { fs.writeFileSync('/dev/shm/x', 'y'); out.write = 'ok'; } catch (e) { out.write = e.code; }
console.log(JSON.stringify(out));
"""
    assert json.loads((await run(manager, session, source)).stdout) == {"entries": [], "write": "EACCES"}


async def test_usage_comes_from_the_engines_counters(manager: SessionManager, session: Session) -> None:
    """gVisor shows a sandbox no cgroup files: the figures are the engine's, for the whole sandbox (gVisor's kernel
    included), and a peak only where the run set a new high-water mark."""
    # A second of CPU as gVisor tells the program; the engine counts on the host, which need not agree exactly.
    busy = await run(manager, session, "while (process.cpuUsage().user < 1e6) {}", timeout=30)
    assert busy.cpu_ms is not None and 300 <= busy.cpu_ms < 5000, busy.cpu_ms
    source = "const held = Buffer.alloc(200e6, 1); setTimeout(() => console.log(held.length), 300);"
    held = await run(manager, session, source, timeout=20)
    assert held.peak_memory_bytes is not None and held.peak_memory_bytes >= 200_000_000, held.peak_memory_bytes
    small = await run(manager, session, "console.log(1)")
    assert small.peak_memory_bytes is None  # below the mark the 200 MB run set: the engine keeps no other


async def test_progress_comes_once_a_second_from_the_host(manager: SessionManager, session: Session) -> None:
    """The host makes a run's progress updates itself (from a thread of its own) at the runner's pace."""
    await write_files(
        manager, session.id, [("slow.js", "console.log('a'); setTimeout(() => {}, 2600);")], overwrite=True
    )
    seen: list[tuple[float, int]] = []

    async def progress(elapsed: float, output_bytes: int) -> None:
        seen.append((elapsed, output_bytes))

    result = await run_entrypoint(manager, session.id, "slow.js", [], timeout_seconds=10, progress=progress)
    assert result.exit_code == 0
    assert len(seen) >= 2 and seen[-1][1] == 2 and all(elapsed >= 0.9 for elapsed, _ in seen), seen


async def test_a_process_whose_name_forges_a_status_line_is_still_counted(
    manager: SessionManager, session: Session
) -> None:
    """gVisor's kernel does not escape a newline in a process's name, the first line of /proc/<pid>/status: a name
    can put a "Uid: 0" line above the real one. The survey believes no field it sees twice."""
    source = """
const { spawn } = require('child_process');
spawn(process.execPath, ['-e', 'process.title = "\\\\nUid:\\\\t0\\\\nX"; setInterval(() => {}, 1000)'],
      { stdio: 'ignore', detached: true }).unref();
setTimeout(() => console.log('left one'), 500);
"""
    result = await run(manager, session, source)
    assert result.stdout == "left one\n"
    assert result.leftover_processes_killed == 1  # counted (as of an unknown uid), then killed
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_no_warm_pool_is_kept_under_gvisor(gvisor: DockerEngine, profile: Profile, image_id: str) -> None:
    """A claim signals the watchdog, whose readiness for it the engine-only model would read with a helper of the
    sandbox uid, which it believes nothing of: the pool stays empty (it would otherwise start containers without end)
    and sandboxes start on demand."""
    del image_id
    manager = SessionManager(gvisor, with_jailed_runs(profile, False), Settings(max_sessions=2, warm_pool=1))
    try:
        with anyio.fail_after(10):
            await manager.pool.run()  # returns at once: nothing to keep
            await manager.pool.wait_for_pool()  # and nobody waits for what never comes
        assert manager.pool.warm_containers == ()
        session = await manager.create()
        assert (await run(manager, session, "console.log('on demand')")).stdout == "on demand\n"
    finally:
        await manager.shutdown()
