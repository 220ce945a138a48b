"""The jailed model (gVisor, ``runsc``, a profile whose runner jails its runs): the channel is root in gVisor's kernel
and starts every program, the next run's process and an evaluation context through the jail, so user code, whether a
run's or a context's, sees the processes of its own run and nothing else: no pid of ours to signal, trace or open
in ``/proc``. Every tool works, and a call costs no ``docker exec``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from code_sandbox.channel.jailed import JailedTransport
from code_sandbox.channel.observed import RuntimeTransport
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import ExecRequest
from code_sandbox.hardening import ROOT_USER, SUPERVISOR_USER
from code_sandbox.profile import Profile
from code_sandbox.sandbox.evaluation import evaluate_code
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import list_files, read_file, write_files
from code_sandbox.settings import Settings

from tests.conftest import WORKER_TAG
from tests.security.conftest import assert_nothing_outlives_the_run
from tests.support.profiles import with_jailed_runs
from tests.support.runtimes import runtime_engine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Every process user code can see, and what it can do to each that is not its own: list or open its descriptors,
# open its memory, signal it, read where its executable, root and working directory are. It starts a child first.
REACH = r"""
const fs = require('fs');
const child = require('child_process').spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], {
  stdio: 'ignore' });
const own = new Set([process.pid, child.pid]);
const seen = {};
for (const pid of fs.readdirSync('/proc').filter((n) => /^[0-9]+$/.test(n)).map(Number)) {
  const r = { uid: /Uid:\s+([0-9]+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'latin1'))[1] };
  if (!own.has(pid)) {
    try { r.fds = fs.readdirSync(`/proc/${pid}/fd`); } catch (e) { r.fds = e.code; }
    r.opened = [];
    for (const fd of Array.isArray(r.fds) ? r.fds : []) {
      for (const mode of ['r', 'w']) {
        try { fs.closeSync(fs.openSync(`/proc/${pid}/fd/${fd}`, mode)); r.opened.push(`${fd}${mode}`); } catch {}
      }
    }
    try { fs.closeSync(fs.openSync(`/proc/${pid}/mem`, 'r')); r.mem = 'opened'; } catch (e) { r.mem = e.code; }
    for (const link of ['exe', 'root', 'cwd']) {
      try { r[link] = fs.readlinkSync(`/proc/${pid}/${link}`); } catch (e) { r[link] = e.code; }
    }
    for (const signal of ['SIGSTOP', 'SIGKILL']) {
      try { process.kill(pid, signal); r[signal] = 'sent'; } catch (e) { r[signal] = e.code; }
    }
  }
  seen[pid] = r;
}
child.kill('SIGKILL');
console.log(JSON.stringify({ self: process.pid, child: child.pid, seen }));
"""


@pytest.fixture(scope="module")
def gvisor() -> Iterator[DockerEngine]:
    yield from runtime_engine("runsc", WORKER_TAG + "-jailed")


@pytest.fixture
async def manager(gvisor: DockerEngine, profile: Profile, image_id: str) -> AsyncIterator[SessionManager]:
    del image_id
    manager = SessionManager(
        gvisor, with_jailed_runs(profile, True), Settings(max_sessions=4, default_timeout=20, max_timeout=60)
    )
    yield manager
    await manager.shutdown()


@pytest.fixture
async def session(manager: SessionManager) -> Session:
    return await manager.create()


def assert_only_its_own_run(report: dict[str, Any]) -> None:
    """What :data:`REACH` saw: its own processes, and the jail's init (root), of which it reaches nothing."""
    seen: dict[str, dict[str, Any]] = report["seen"]
    others = {int(pid): row for pid, row in seen.items() if int(pid) not in (report["self"], report["child"])}
    assert list(others) == [1], seen  # the jail's init; nothing of the container: no helper, no watchdog, no init
    init = others[1]
    assert init["uid"] == "0" and init["opened"] == [] and len(init["fds"]) == 1, init
    assert (init["mem"], init["exe"], init["root"], init["cwd"]) == ("EACCES",) * 4, init
    assert (init["SIGSTOP"], init["SIGKILL"]) == ("EPERM", "EPERM"), init


async def test_the_jailed_transport_serves_runsc_and_every_tool_works(
    manager: SessionManager, session: Session
) -> None:
    transport = manager.provisioner.transport
    assert isinstance(transport, RuntimeTransport) and isinstance(transport.chosen, JailedTransport)
    await write_files(manager, session.id, [("src/a.txt", "é😀\n"), ("b.js", "console.log(1)")], overwrite=False)
    entries, _truncated = await list_files(manager, session.id, ".", recursive=True, max_depth=10)
    assert sorted(entry.path for entry in entries) == ["b.js", "src", "src/a.txt"]
    assert (await read_file(manager, session.id, "src/a.txt", max_bytes=100)).content == "é😀\n"
    assert (await evaluate_code(manager, session.id, "let n = 41", timeout_seconds=10, reset=False)).error is None
    assert (await evaluate_code(manager, session.id, "n + 1", timeout_seconds=10, reset=False)).value == "42"
    source = "console.log('out', process.getuid() === require('fs').statSync('.').uid); console.error('err');"
    await write_files(manager, session.id, [("run.js", source + "process.exitCode = 3")], overwrite=False)
    result = await run_entrypoint(manager, session.id, "run.js", [], timeout_seconds=10)
    assert (result.exit_code, result.signal, result.stdout, result.stderr) == (3, None, "out true\n", "err\n")
    await write_files(manager, session.id, [("die.js", "process.kill(process.pid, 'SIGTERM')")], overwrite=False)
    killed = await run_entrypoint(manager, session.id, "die.js", [], timeout_seconds=10)
    assert (killed.exit_code, killed.signal) == (None, "SIGTERM")  # the jail ends as its program did
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_a_run_reaches_no_process_but_its_own(manager: SessionManager, session: Session) -> None:
    await write_files(manager, session.id, [("reach.js", REACH)], overwrite=False)
    result = await run_entrypoint(manager, session.id, "reach.js", [], timeout_seconds=20)
    assert result.exit_code == 0, result.stderr
    assert_only_its_own_run(json.loads(result.stdout))
    await assert_nothing_outlives_the_run(manager.provisioner.engine, session)


async def test_an_evaluation_context_reaches_no_process_but_its_own(manager: SessionManager, session: Session) -> None:
    evaluated = await evaluate_code(manager, session.id, REACH, timeout_seconds=20, reset=False)
    assert evaluated.error is None and evaluated.context_ended is None, evaluated
    assert_only_its_own_run(json.loads(evaluated.stdout))


# Every directory a jailed program may write into, and every file it may both write and execute, outside its proc.
WRITABLE = r"""
const fs = require('fs');
const found = { dirs: [], runnable: [] };
const walk = (dir, depth) => {
  let names;
  try { names = fs.readdirSync(dir); } catch { return; }
  for (const name of names) {
    const path = (dir === '/' ? '' : dir) + '/' + name;
    if (path === '/proc' || path === '/sys') continue;
    let st;
    try { st = fs.lstatSync(path); } catch { continue; }
    const writable = (() => { try { fs.accessSync(path, fs.constants.W_OK); return true; } catch { return false; } })();
    if (st.isDirectory()) {
      if (writable) found.dirs.push(path);
      if (depth < 6) walk(path, depth + 1);
    } else if (st.isFile() && writable) {
      try { fs.accessSync(path, fs.constants.X_OK); found.runnable.push(path); } catch {}
    }
  }
};
walk('/', 0);
console.log(JSON.stringify(found));
"""


async def test_a_jailed_program_can_write_only_its_workspace_and_scratch_and_execute_nothing_it_wrote(
    manager: SessionManager, session: Session
) -> None:
    """The jail binds the container's mounts one by one: the directories of gVisor's ``/dev`` under the sealed
    ``/dev/pts`` and ``/dev/mqueue`` (writable by all, executable) must stay covered in the jail too."""
    await write_files(manager, session.id, [("walk.js", WRITABLE)], overwrite=False)
    result = await run_entrypoint(manager, session.id, "walk.js", [], timeout_seconds=30)
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.stdout)
    assert set(found["dirs"]) <= {"/workspace", "/tmp"}, found["dirs"]
    assert found["runnable"] == [], found["runnable"]
    escape = "require('fs').writeFileSync('/dev/mqueue/x', 'x')"
    await write_files(manager, session.id, [("mq.js", escape)], overwrite=False)
    refused = await run_entrypoint(manager, session.id, "mq.js", [], timeout_seconds=10)
    assert refused.exit_code == 1 and ("EROFS" in refused.stderr or "EACCES" in refused.stderr), refused.stderr


COUNTERS = r"""
const fs = require('fs'); const out = {};
try { out.listed = fs.readdirSync('/usr/local/gvisor/counters'); } catch (e) { out.listed = e.code; }
out.mounted = fs.readFileSync('/proc/self/mountinfo', 'latin1').split('\n')
  .filter((line) => / \/usr\/local\/gvisor\/counters /.test(line)).length;
console.log(JSON.stringify(out));
"""


async def test_a_run_reports_gvisors_counters_which_no_jailed_program_can_reach(
    manager: SessionManager, session: Session
) -> None:
    """``jail bind`` mounts gVisor's cgroup counters read-only for the channel in ``/usr/local/gvisor/counters``, which
    only root may pass: a jail's root is a bind of the container's root alone, so a jailed program finds the image's
    directory there, and a uid of the container's own view (the survey's) cannot pass it either."""
    busy = "const s = process.cpuUsage(); const c = () => { const u = process.cpuUsage(s); return u.user + u.system; };"
    busy += "while (c() < 5e5);"  # half a second from here: the waiting process booted the runtime before the run
    await write_files(manager, session.id, [("counters.js", COUNTERS), ("busy.js", busy)], overwrite=False)
    result = await run_entrypoint(manager, session.id, "counters.js", [], timeout_seconds=10)
    assert json.loads(result.stdout) == {"listed": "EACCES", "mounted": 0}, result.stdout
    used = await run_entrypoint(manager, session.id, "busy.js", [], timeout_seconds=10)
    assert used.cpu_ms is not None and 400 <= used.cpu_ms <= 3000, used
    assert used.peak_memory_bytes is not None and used.peak_memory_bytes < 100_000_000, used
    engine, profile = manager.provisioner.engine, manager.provisioner.profile
    for user, expected in ((SUPERVISOR_USER, b"EACCES"), (ROOT_USER, b"EROFS")):
        argv = runtime_argv(engine, profile, ["/usr/local/bin/node", "-e", _MOVE_A_TASK])
        seen = engine.exec(session.container_id, ExecRequest(argv, user=user, timeout=30, max_stdout=1024))
        assert seen.stdout.strip() == expected, (user, seen)


# Moves itself into the counters' cgroup (what writing a limit or a task there would take).
_MOVE_A_TASK = """
try { require('fs').appendFileSync('/usr/local/gvisor/counters/cgroup/cgroup.procs', `${process.pid}\\n`);
  console.log('moved'); } catch (e) { console.log(e.code); }
"""
