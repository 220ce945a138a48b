"""The next run's process, which a sandbox's channel starts ahead of the run: a program finds in it what a fresh
``node --disable-proto=throw /workspace/<entrypoint>`` gives it, never a process that ran anything before, and the
survey spares that process and nothing that only looks like it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from code_sandbox.engine import ExecRequest
from code_sandbox.hardening import SUPERVISOR_USER
from code_sandbox.profile import Profile
from code_sandbox.sandbox.evaluation import evaluate_code
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import write_files

from tests.security.conftest import sandbox_members, sandbox_processes

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

ANATOMY_CJS = """
const fs = require('fs');
// What is open, by kind (the numbers differ: a fresh node's event loop takes fd 3, ours took it later).
const fds = fs.readdirSync('/proc/self/fd').map((fd) => { try { return fs.readlinkSync(`/proc/self/fd/${fd}`); }
  catch { return 'gone'; } }).map((link) => link.replace(/[0-9]+/g, 'N')).sort();
console.log(JSON.stringify({
  argv: process.argv, execArgv: process.execArgv, main: require.main === module, filename: __filename,
  mainModule: process.mainModule && process.mainModule.filename, fds, cwd: process.cwd(), env: process.env,
  cache: Object.keys(require.cache), pid: process.pid, title: process.title, stdin: fs.fstatSync(0).isCharacterDevice(),
}));
"""

ANATOMY_ESM = """
console.log(JSON.stringify({ url: import.meta.url, argv: process.argv, mainModule: process.mainModule ?? null }));
"""


@pytest.fixture
async def session(manager: SessionManager) -> Session:
    return await manager.create()


async def run(manager: SessionManager, session: Session, name: str, source: str, *arguments: str) -> RunResult:
    await write_files(manager, session.id, [(name, source)], overwrite=True)
    return await run_entrypoint(manager, session.id, name, list(arguments), timeout_seconds=10)


FRESH = """
const { spawnSync } = require('child_process');
const [entrypoint, ...rest] = process.argv.slice(2);
const fresh = spawnSync(process.execPath, ['--disable-proto=throw', entrypoint, ...rest], {
  encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'],
});
process.stdout.write(fresh.stdout);
"""


async def _anatomies(
    manager: SessionManager, session: Session, name: str, source: str
) -> tuple[dict[str, object], dict[str, object]]:
    """What the program sees run as a run (in the waiting process), and run by a fresh ``node`` started the way the
    runner would (spawned from another program in the same sandbox, with its environment and working directory)."""
    await write_files(manager, session.id, [(name, source), ("fresh.js", FRESH)], overwrite=True)
    run = await run_entrypoint(manager, session.id, name, ["a", "b c"], timeout_seconds=10)
    fresh = await run_entrypoint(
        manager, session.id, "fresh.js", [f"/workspace/{name}", "a", "b c"], timeout_seconds=10
    )
    return json.loads(run.stdout), json.loads(fresh.stdout)


async def test_a_program_sees_what_a_fresh_node_gives_it(manager: SessionManager, session: Session) -> None:
    ran, fresh = await _anatomies(manager, session, "main.js", ANATOMY_CJS)
    assert ran.pop("pid") != fresh.pop("pid")
    assert ran == fresh
    assert ran["argv"] == ["/usr/local/bin/node", "/workspace/main.js", "a", "b c"] and ran["main"] is True
    ran, fresh = await _anatomies(manager, session, "main.mjs", ANATOMY_ESM)
    assert ran == fresh and ran["url"] == "file:///workspace/main.mjs" and ran["mainModule"] is None


async def test_an_uncaught_error_shows_no_frame_of_ours(manager: SessionManager, session: Session) -> None:
    for name, source in (("boom.js", "null.x"), ("boom.mjs", "null.x"), ("boom.ts", "const n: null = null; n!.x")):
        result = await run(manager, session, name, source)
        assert result.exit_code == 1 and "TypeError: Cannot read properties of null" in result.stderr, result.stderr
        assert "/opt/sandbox" not in result.stderr and "start.mjs" not in result.stderr


async def test_every_run_gets_a_process_that_never_ran_anything(manager: SessionManager, session: Session) -> None:
    """A run leaves nothing for the next one: not its globals, not its process (the next is started after it)."""
    source = "console.log(JSON.stringify([process.pid, globalThis.mark ?? null])); globalThis.mark = 'left';"
    seen = [json.loads((await run(manager, session, "mark.js", source)).stdout) for _ in range(3)]
    assert [mark for _pid, mark in seen] == [None, None, None]
    assert len({pid for pid, _mark in seen}) == 3


async def test_no_waiting_process_shares_the_sandbox_with_an_evaluation_context(
    manager: SessionManager, session: Session
) -> None:
    await run(manager, session, "main.js", "console.log(1)")
    assert await anyio.to_thread.run_sync(_waiting, session) == 1
    await evaluate_code(manager, session.id, "globalThis.kept = 1", timeout_seconds=5, reset=False)
    assert await anyio.to_thread.run_sync(_waiting, session, 0) == 0
    # A run ends the context, and the next run's process is back.
    await run(manager, session, "main.js", "console.log(1)")
    assert await anyio.to_thread.run_sync(_waiting, session) == 1


SURVEY_ARGV_TAIL = ["--survey"]


async def test_the_survey_spares_the_waiting_process_only_as_the_channels_child_started_since_the_run(
    manager: SessionManager, session: Session, profile: Profile
) -> None:
    """The host names the waiting process as >tick, the tick the channel read once the run's leftovers were gone: one
    child of the channel started since then is spared; one that started earlier, or anyone else's child, is not."""
    await run(manager, session, "main.js", "console.log(1)")
    assert await anyio.to_thread.run_sync(_waiting, session) == 1
    _waiting_pid, started = await anyio.to_thread.run_sync(_process_of, session, "next run")
    channel, _started = await anyio.to_thread.run_sync(_process_of, session, "channel")
    engine = manager.provisioner.engine
    argv = [*profile.helper_argv("runner"), *SURVEY_ARGV_TAIL]

    def survey(line: str) -> int:
        request = ExecRequest(argv, user=SUPERVISOR_USER, timeout=30, max_stdout=4096, stdin=[f"{line}\n".encode()])
        result = engine.exec(session.container_id, request)
        return int(json.loads(result.stdout)["alive"])

    assert survey(f"{channel} >{started}") == 0
    assert survey(f"{channel} >{started + 1}") == 1  # started before the announced tick: a run's, as far as it knows
    assert survey(f"{channel}") == 1
    assert survey(f"1 >{started}") == 2  # not the named channel's child: counted (and the channel too)


@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL])
async def test_a_waiting_process_that_was_stopped_or_died_is_not_used(
    manager: SessionManager, session: Session, fault: signal.Signals
) -> None:
    """A waiting process that cannot take the program (stopped, or gone: a bug, or the OOM killer) is ended and the
    program gets a fresh process: its run never times out in a stopped process or reports another's end."""
    await run(manager, session, "main.js", "console.log(1)")
    assert await anyio.to_thread.run_sync(_waiting, session) == 1
    host_pid = await anyio.to_thread.run_sync(_host_pid_of, session, "next run")
    os.kill(host_pid, fault)
    result = await run(manager, session, "main.js", "console.log('fresh')")
    assert (result.stdout, result.exit_code, result.timed_out) == ("fresh\n", 0, False)
    assert await anyio.to_thread.run_sync(_waiting, session) == 1  # and a new one waits for the run after


def _waiting(session: Session, want: int = 1) -> int:
    """How many next-run processes the sandbox holds (in whatever state: one may still be starting), once that is
    ``want`` or after 5 s: the channel starts one right after it answered a run."""
    end = time.monotonic() + 5
    while True:
        states = sandbox_processes(session.container_id, session.uid)
        count = sum(count for key, count in states.items() if key.startswith("next run:"))
        if count == want or time.monotonic() > end:
            return count
        time.sleep(0.05)


def _host_pid_of(session: Session, role: str) -> int:
    """The host pid of the sandbox's one process in ``role`` (``tests.security.conftest.HELPER_ROLES``)."""
    pids = [pid for pid, name, _state in sandbox_members(session.container_id, session.uid) if name == role]
    assert len(pids) == 1, (role, pids)
    return pids[0]


def _process_of(session: Session, role: str) -> tuple[int, int]:
    """That process's pid in the container's pid namespace (the last of NSpid) and its start time (clock ticks after
    boot)."""
    entry = Path(f"/proc/{_host_pid_of(session, role)}")
    status = (entry / "status").read_text()
    inner = int(next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1])
    return inner, int((entry / "stat").read_text().rsplit(")", 1)[1].split()[19])
