"""Fixtures for attacks: a victim sandbox, a bystander sandbox, and checks that only the victim was touched."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.execution import RunResult, run_entrypoint
from code_sandbox.plugins import Profile
from code_sandbox.sessions import Session, SessionManager
from code_sandbox.settings import Settings
from code_sandbox.workspace import read_file, write_files

BYSTANDER_FILE = ("keep/safe.txt", "the bystander's data: é😀\n")


def host_process_count() -> int:
    return len(_host_pids())


def _host_pids() -> set[str]:
    """User-space processes on the host; kernel threads (children of kthreadd, pid 2) come and go with load."""
    pids: set[str] = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "2":
            with contextlib.suppress(OSError, IndexError):
                if Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1] != "2":
                    pids.add(name)
    return pids


def _new_process_states(before: set[str]) -> dict[str, int]:
    """Processes that were not there before, counted by command name and scheduler state (R, S, D, Z, ...)."""
    states: dict[str, int] = {}
    for pid in _host_pids() - before:
        with contextlib.suppress(OSError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            key = f"{stat.split('(', 1)[1].rsplit(')', 1)[0]}:{stat.rsplit(')', 1)[1].split()[0]}"
            states[key] = states.get(key, 0) + 1
    return states


@dataclass
class Arena:
    manager: SessionManager
    victim: Session
    bystander: Session
    host_processes_before: int
    host_pids_before: set[str]

    async def attack(self, source: str, *, timeout: int = 10, name: str = "attack.js") -> RunResult:  # noqa: ASYNC109
        """Run hostile code in the victim sandbox."""
        await write_files(self.manager, self.victim.id, [(name, source)], overwrite=True)
        return await run_entrypoint(self.manager, self.victim.id, name, [], timeout_seconds=timeout)

    async def assert_bystander_unaffected(self) -> None:
        """The other sandbox still has its files and still runs programs; the host gained no processes."""
        content = await read_file(self.manager, self.bystander.id, BYSTANDER_FILE[0], max_bytes=4096)
        assert content.content == BYSTANDER_FILE[1]
        await write_files(self.manager, self.bystander.id, [("probe.js", "console.log(6 * 7)")], overwrite=True)
        result = await run_entrypoint(self.manager, self.bystander.id, "probe.js", [], timeout_seconds=10)
        assert (result.exit_code, result.stdout) == (0, "42\n")
        # The host's process count comes back to where it was. Killed processes of a sandbox under memory
        # pressure can take a while to finish exiting on a loaded two-core machine, hence the generous bound.
        with anyio.move_on_after(60):
            while host_process_count() > self.host_processes_before + 5:  # noqa: ASYNC110 - polls the host
                await anyio.sleep(0.2)
        assert host_process_count() <= self.host_processes_before + 5, _new_process_states(self.host_pids_before)


@pytest.fixture
async def arena(engine: DockerEngine, profile: Profile, image_id: str) -> AsyncGenerator[Arena]:
    del image_id
    manager = SessionManager(engine, profile, Settings(max_sessions=4, default_timeout=10, max_timeout=60))
    victim, bystander = await manager.create(), await manager.create()
    await write_files(manager, bystander.id, [BYSTANDER_FILE], overwrite=False)
    yield Arena(manager, victim, bystander, host_process_count(), _host_pids())
    await manager.shutdown()
