"""Snapshots outlive the server that made them, and a server killed at any point of a snapshot or a restore leaves
nothing that restores half and nothing that is never cleaned: real ``code-sandbox serve`` processes, SIGKILLed."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.profile import Profile
from code_sandbox.sandbox.snapshot_store import LABEL_SNAPSHOT, SnapshotStore
from code_sandbox.settings import Settings

from tests.conformance.programs import JAVASCRIPT
from tests.conftest import WORKER_TAG
from tests.support.run import worker_containers
from tests.test_server import CLI, server_env

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("cleanup_managed", "snapshots_removed", "image_id")]

# About 8 MiB in 400 files, besides every kind of entry the tree program makes.
BULK = """
const fs = require('fs');
fs.mkdirSync('bulk');
for (let i = 0; i < 400; i++) fs.writeFileSync(`bulk/${i}.bin`, Buffer.alloc(20000 + i, i % 251));
"""
FILES = [
    {"path": "tree.js", "content": JAVASCRIPT.tree},
    {"path": "listing.js", "content": JAVASCRIPT.listing},
    {"path": "bulk.js", "content": BULK},
]


class Server:
    """A ``code-sandbox serve`` process spoken to in JSON-RPC lines."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc = subprocess.Popen(
            [CLI, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=server_env(tmp_path),
        )  # fmt: skip
        self.ids = itertools.count(1)
        self.send({"method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}})  # fmt: skip
        self.answer()
        self.send({"method": "notifications/initialized"}, notification=True)

    def send(self, message: dict[str, Any], *, notification: bool = False) -> None:
        assert self.proc.stdin is not None
        if not notification:
            message = {"id": next(self.ids), **message}
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        return json.loads(self.proc.stdout.readline())

    def start(self, tool: str, **arguments: Any) -> None:
        self.send({"method": "tools/call", "params": {"name": tool, "arguments": arguments}})

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        self.start(tool, **arguments)
        result = self.answer()["result"]
        assert result["isError"] is False, result["content"]
        return result["structuredContent"]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.close()

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0
        self.close()

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def serving(tmp_path: Path) -> Generator[Server]:
    server = Server(tmp_path)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.kill()


def made(server: Server) -> tuple[str, list[list[Any]]]:
    session = server.call("create_sandbox")["session_id"]
    server.call("write_files", session_id=session, files=FILES)
    for program in ("tree.js", "bulk.js"):
        assert server.call("run_javascript", session_id=session, entrypoint=program)["exit_code"] == 0
    return session, listing(server, session)


def listing(server: Server, session: str) -> list[list[Any]]:
    ran = server.call("run_javascript", session_id=session, entrypoint="listing.js")
    assert ran["exit_code"] == 0, ran["stderr"]
    return [row for row in json.loads(ran["stdout"]) if row[0] != "special"]


def store_of(engine: DockerEngine, profile: Profile, tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(engine, Settings(), profile.name, tmp_path / "xdg-state" / "code-sandbox")


def wait_for_no_container(engine: DockerEngine, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while worker_containers(engine):
        assert time.monotonic() < deadline, [c.state for c in worker_containers(engine)]
        time.sleep(0.2)


def every_snapshot_restores_whole(engine: DockerEngine, store: SnapshotStore) -> list[str]:
    """Every snapshot image of this worker is one a name leads to, whose content passes every check; their names."""
    images = [s for s in engine.list_snapshots(f"{LABEL_TAG}={WORKER_TAG}") if LABEL_SNAPSHOT in s.labels]
    kept = store.kept()
    assert len(kept) == len(images)  # no image that no name leads to: nothing half made, nothing left uncleaned
    for info in kept:
        assert info.sealed
        store.load(info)  # raises if the content is not whole
    return [info.name for info in kept]


def test_a_snapshot_survives_its_server_killed_and_a_new_server_restores_every_file_by_hash_and_mode(
    tmp_path: Path, engine: DockerEngine
) -> None:
    with serving(tmp_path) as first:
        source, before = made(first)
        saved = first.call("snapshot_sandbox", session_id=source, name="across-restarts")
        assert saved["files"] == 3 + 6 + 400
        first.kill()
    wait_for_no_container(engine)  # the killed server's sandbox ended itself
    with serving(tmp_path) as second:
        assert [row["name"] for row in second.call("list_snapshots")["snapshots"]] == ["across-restarts"]
        restored = second.call("create_sandbox", from_snapshot="across-restarts")["session_id"]
        after = listing(second, restored)
        assert after == before
        assert {row[1] for row in after} == {"file", "directory", "symlink"}
        second.stop()


@pytest.mark.slow
def test_a_server_killed_during_a_snapshot_leaves_a_whole_snapshot_or_none(
    tmp_path: Path, engine: DockerEngine, profile: Profile
) -> None:
    store = store_of(engine, profile, tmp_path)
    with serving(tmp_path) as server:  # how long a snapshot takes on this machine now
        source, _before = made(server)
        started = time.monotonic()
        server.call("snapshot_sandbox", session_id=source, name="timed")
        took = time.monotonic() - started
        server.stop()
    outcomes: list[bool] = []
    # Kills at shares of that time, and one long after it (a new server's first snapshot may take longer).
    for number, delay in enumerate([took * share for share in (0.05, 0.3, 0.6, 0.9, 1.2)] + [took + 5]):
        with serving(tmp_path) as server:
            source, _before = made(server)
            server.start("snapshot_sandbox", session_id=source, name=f"killed-{number}")
            time.sleep(delay)
            server.kill()
        wait_for_no_container(engine)
        names = every_snapshot_restores_whole(engine, store)
        outcomes.append(f"killed-{number}" in names)
    assert not all(outcomes), "no kill fell inside a snapshot: the test proves nothing"
    assert any(outcomes), "no snapshot was made before a kill: the delays are too short for this machine"


@pytest.mark.slow
def test_a_server_killed_during_a_restore_leaves_no_sandbox_and_the_snapshot_as_it_was(
    tmp_path: Path, engine: DockerEngine, profile: Profile
) -> None:
    store = store_of(engine, profile, tmp_path)
    with serving(tmp_path) as server:
        source, before = made(server)
        server.call("snapshot_sandbox", session_id=source, name="restored-while-killed")
        server.stop()
    for delay in (0.02, 0.1, 0.2, 0.35):
        with serving(tmp_path) as server:
            server.start("create_sandbox", from_snapshot="restored-while-killed")
            time.sleep(delay)
            server.kill()
        wait_for_no_container(engine)
        assert every_snapshot_restores_whole(engine, store) == ["restored-while-killed"]
    with serving(tmp_path) as server:
        restored = server.call("create_sandbox", from_snapshot="restored-while-killed")["session_id"]
        assert listing(server, restored) == before
        server.stop()
