"""Fixtures for attacks: a victim sandbox, a bystander sandbox, and checks that only the victim was touched; and one
shared sandbox per worker for probes that only look.

An attack that may change or destroy its sandbox (bombs, floods, races, writes, signals) gets an :class:`Arena` of
its own. A probe that only reads (capabilities, network configuration, ``/proc``, the environment, the hostname,
missing tools) runs in the worker's :class:`SharedSandbox`, which is checked after every probe to hold nothing but
its idle processes, so no probe leaves anything behind for the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import anyio
import anyio.to_thread
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from code_sandbox.channel.jailed import JailedTransport
from code_sandbox.channel.observed import RuntimeTransport
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import Engine, ExecRequest
from code_sandbox.hardening import LABEL_TAG, PROBE_UID, readable_runtime, user_of
from code_sandbox.profile import Profile
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import Session, SessionManager
from code_sandbox.sandbox.workspace import read_file, write_files
from code_sandbox.settings import Settings

from tests.support.run import remove_tagged, worker_tag
from tests.support.runtimes import TEST_RUNTIMES, runtime_engine

BYSTANDER_FILE = ("keep/safe.txt", "the bystander's data: é😀\n")
SHARED_TAG = worker_tag("shared")
"""The shared sandboxes' own tag (one sandbox per runtime, the runtime's name appended): ``cleanup_managed`` removes
only the worker's tag, so it never removes these."""


@pytest.fixture(scope="session", params=TEST_RUNTIMES)
def engine(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """Every attack runs under each container runtime: the host's kernel (runc) and gVisor's (runsc)."""
    yield from runtime_engine(request.param, worker_tag())


HELPER_ROLES = (
    ("/sbin/docker-init ", "docker-init"), ("/usr/local/gvisor/jail run ", "jail"), ("/opt/sandbox/watchdog.mjs", "watchdog"),
    ("/opt/sandbox/runner.mjs --channel", "channel"), ("/opt/sandbox/runner.mjs --supervise", "supervisor"),
    ("/opt/sandbox/start.mjs", "next run"),
)  # fmt: skip
"""What a sandbox runs between calls, by the command line each is started with (the first that matches: docker-init's
names the watchdog it starts)."""


def role(cmdline: str, name: str) -> str:
    """What a process of a sandbox is, from its command line; anything else by its command name."""
    return next((role for key, role in HELPER_ROLES if key in cmdline), name)


def sandbox_members(container_id: str, uid: int) -> list[tuple[int, str, str]]:
    """Host processes that belong to one sandbox: inside its container's cgroup, or running as its uid anywhere. Each
    as its host pid, its role (:data:`HELPER_ROLES`; anything else by command name) and scheduler state (R, S, D, Z,
    ...)."""
    members: list[tuple[int, str, str]] = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            status = Path(f"/proc/{pid}/status").read_text()
            uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
            if str(uid) not in uids and container_id not in Path(f"/proc/{pid}/cgroup").read_text():
                continue
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            name = role(cmdline, stat.split("(", 1)[1].rsplit(")", 1)[0])
            members.append((int(pid), name, stat.rsplit(")", 1)[1].split()[0]))
    return members


def sandbox_processes(container_id: str, uid: int) -> dict[str, int]:
    """:func:`sandbox_members` counted by ``role:state``."""
    states: dict[str, int] = {}
    for _pid, name, state in sandbox_members(container_id, uid):
        states[f"{name}:{state}"] = states.get(f"{name}:{state}", 0) + 1
    return states


# Under gVisor the sandbox's processes live in its own kernel, not the host's: they are counted from inside, by a
# probe of a uid outside every sandbox's range (the probe itself is left out).
_GVISOR_SURVEY = r"""
const fs = require('fs');
const ROLES = JSON.parse(process.argv[1]);
const states = {};
for (const pid of fs.readdirSync('/proc')) {
  if (!/^[0-9]+$/.test(pid) || Number(pid) === process.pid) continue;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'latin1').replaceAll('\0', ' ');
    const name = (ROLES.find(([key]) => cmdline.includes(key)) ?? [null, stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))])[1];
    const key = `${name}:${stat.slice(stat.lastIndexOf(')') + 2)[0]}`;
    states[key] = (states[key] ?? 0) + 1;
  } catch {}
}
console.log(JSON.stringify(states));
"""


def gvisor_processes(engine: Engine, container_id: str) -> dict[str, int]:
    """The processes of a gVisor sandbox, as its own kernel lists them, by command name and state."""
    argv = [readable_runtime("/usr/local/bin/node"), "-e", _GVISOR_SURVEY, json.dumps(HELPER_ROLES)]
    result = engine.exec(container_id, ExecRequest(argv, user=user_of(PROBE_UID), timeout=30, max_stdout=65536))
    assert result.exit_code == 0, result.stderr
    return cast(dict[str, int], json.loads(result.stdout))


def _processes(engine: Engine, session: Session) -> dict[str, int]:
    if engine.runtime_in_force().user_space_kernel:
        if engine.container_facts(session.container_id) is None:
            return {}  # gone: its processes went with the gVisor kernel that ran them
        return gvisor_processes(engine, session.container_id)
    return sandbox_processes(session.container_id, session.uid)


def _between_runs(states: dict[str, int]) -> bool:
    """All a sandbox holds between runs: docker-init, the watchdog, the session's two channels (a runner as the sandbox
    uid, or root's jailing one under gVisor, and one as the supervisor) and the next run's process, one of each at
    most, all sleeping (under gVisor, with the jail that started it and that jail's init); or nothing at all."""
    allowed = {f"{name}:{state}" for _key, name in HELPER_ROLES for state in ("S", "I")}
    return all(key in allowed and count <= (2 if key.startswith("jail:") else 1) for key, count in states.items())


async def assert_nothing_outlives_the_run(engine: Engine, session: Session) -> None:
    """The sandbox is back to what it holds between runs, inside its container and anywhere else on the host."""
    # Killed processes of a sandbox under memory pressure can take a while to finish exiting on a loaded
    # two-core machine, hence the generous bound. The verdict is the last sample the loop saw, not a fresh one:
    # docker-init and the watchdog wake up now and then, and a sample taken just then shows one of them running.
    states = await anyio.to_thread.run_sync(_processes, engine, session)
    with anyio.move_on_after(60):
        while not _between_runs(states):
            await anyio.sleep(0.2)
            states = await anyio.to_thread.run_sync(_processes, engine, session)
    assert _between_runs(states), states


def under_gvisor(manager: SessionManager) -> bool:
    """Whether the manager's sandboxes run under gVisor (jailed runs, or the engine-only trust model)."""
    return manager.provisioner.engine.runtime_in_force().user_space_kernel


def jailed(manager: SessionManager) -> bool:
    """Whether the manager's sandboxes run jailed (gVisor): a run then sees its own namespace's processes alone."""
    transport = manager.provisioner.transport
    return isinstance(transport, RuntimeTransport) and isinstance(transport.chosen, JailedTransport)


@dataclass
class Arena:
    manager: SessionManager
    victim: Session
    bystander: Session

    @property
    def gvisor(self) -> bool:
        return under_gvisor(self.manager)

    @property
    def jailed(self) -> bool:
        return jailed(self.manager)

    async def attack(self, source: str, *, timeout: int = 10, name: str = "attack.js") -> RunResult:  # noqa: ASYNC109
        """Run hostile code in the victim sandbox."""
        await write_files(self.manager, self.victim.id, [(name, source)], overwrite=True)
        return await run_entrypoint(self.manager, self.victim.id, name, [], timeout_seconds=timeout)

    async def timed_attack(self, source: str, *, timeout: int = 10) -> tuple[float, float, RunResult]:  # noqa: ASYNC109
        """Run a one-line program and then hostile code in the victim, each timed from the host's call to its
        answer: ``(seconds, control_seconds, result)``. The control tells how slow a run is on this machine right
        now, so a bound on ``seconds - control_seconds`` holds on a loaded machine too."""
        files = [("control.js", "console.log('control');"), ("timed.js", source)]
        await write_files(self.manager, self.victim.id, files, overwrite=True)
        started = time.monotonic()
        control = await run_entrypoint(self.manager, self.victim.id, "control.js", [], timeout_seconds=10)
        control_seconds = time.monotonic() - started
        assert (control.exit_code, control.stdout) == (0, "control\n")
        started = time.monotonic()
        result = await run_entrypoint(self.manager, self.victim.id, "timed.js", [], timeout_seconds=timeout)
        return time.monotonic() - started, control_seconds, result

    async def assert_bystander_unaffected(self) -> None:
        """The other sandbox still has its files and still runs programs; no process of either sandbox outlives its
        run, inside the container or anywhere else on the host."""
        content = await read_file(self.manager, self.bystander.id, BYSTANDER_FILE[0], max_bytes=4096)
        assert content.content == BYSTANDER_FILE[1]
        await write_files(self.manager, self.bystander.id, [("probe.js", "console.log(6 * 7)")], overwrite=True)
        result = await run_entrypoint(self.manager, self.bystander.id, "probe.js", [], timeout_seconds=10)
        assert (result.exit_code, result.stdout) == (0, "42\n")
        for session in (self.victim, self.bystander):
            await assert_nothing_outlives_the_run(self.manager.provisioner.engine, session)


@pytest.fixture
async def arena(manager: SessionManager) -> Arena:
    """Two sandboxes of one manager, as one server holds them; created side by side."""
    sessions: list[Session] = []

    async def create() -> None:
        sessions.append(await manager.create())

    async with anyio.create_task_group() as group:
        group.start_soon(create)
        group.start_soon(create)
    victim, bystander = sessions
    await write_files(manager, bystander.id, [BYSTANDER_FILE], overwrite=False)
    return Arena(manager, victim, bystander)


@dataclass
class SharedSandbox:
    """One sandbox of this worker for read-only probes, driven through its own event loop (``portal``), so it can
    outlive the event loop of each test."""

    portal: BlockingPortal
    manager: SessionManager
    _session: Session | None = None

    @property
    def gvisor(self) -> bool:
        return under_gvisor(self.manager)

    @property
    def jailed(self) -> bool:
        return jailed(self.manager)

    @property
    def session(self) -> Session:
        assert self._session is not None, "probe() first"
        return self._session

    async def probe(self, source: str, *, timeout: int = 10) -> RunResult:  # noqa: ASYNC109
        """Run a probe that only reads; afterwards the sandbox holds nothing of it."""
        result = await anyio.to_thread.run_sync(self.portal.call, partial(self._run, source, timeout))
        await assert_nothing_outlives_the_run(self.manager.provisioner.engine, self.session)
        return result

    async def _run(self, source: str, timeout: int) -> RunResult:  # noqa: ASYNC109 - runs in the portal's loop
        if self._session is None or self._session.state != "active":
            # Made on first use; remade only if an earlier probe's failure took it down, so one failure stays one.
            self._session = await self.manager.create()
        await write_files(self.manager, self._session.id, [("probe.js", source)], overwrite=True)
        return await run_entrypoint(self.manager, self._session.id, "probe.js", [], timeout_seconds=timeout)


@pytest.fixture(scope="session")
def shared(engine: DockerEngine, profile: Profile, image_id: str) -> Iterator[SharedSandbox]:
    """The worker's shared sandbox, on its own engine and tag (and the runtime under test); removed at the end of the
    worker's session."""
    del image_id
    tag = f"{SHARED_TAG}-{engine.runtime}"
    engine = DockerEngine(labels={LABEL_TAG: tag}, runtime=engine.runtime)
    # Long enough to outlive the worker's session, so the sandbox never expires between two probes; room for a
    # replacement while a broken one is still being removed.
    settings = Settings(max_sessions=2, default_timeout=10, max_timeout=60, max_lifetime=3600, idle_timeout=1800)
    try:
        with start_blocking_portal("asyncio") as portal:
            manager = portal.call(partial(SessionManager, engine, profile, settings))
            try:
                yield SharedSandbox(portal, manager)
            finally:
                portal.call(manager.shutdown)
    finally:
        left = remove_tagged(engine, tag)
        engine.close()
    assert left == 0, f"{left} container(s) of the shared sandbox outlived its shutdown"
