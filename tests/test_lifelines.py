"""A sandbox ends itself when its server is gone, however the server went and whatever it was doing: no container is
left running for the next start's sweep. Clients end their servers every way there is: Codex sends SIGTERM, closes
stdin, and kills the whole process group 14 ms later."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_RUNTIME

from tests.support.run import worker_containers
from tests.test_server import CLI, server_env

pytestmark = [
    pytest.mark.docker,
    pytest.mark.serial,  # servers started, filled and killed: CPU the other tests' deadlines need
    pytest.mark.usefixtures("image_id", "cleanup_managed"),
]

INITIALIZE: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
INITIALIZED: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/initialized"}
CREATE: dict[str, Any] = {
    "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "create_sandbox", "arguments": {}}
}  # fmt: skip


def _spawn(tmp_path: Path, warm_pool: int) -> subprocess.Popen[bytes]:
    """``serve`` as a client starts it, in a process group of its own (which some clients kill whole)."""
    return subprocess.Popen(
        [CLI, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=server_env(tmp_path, warm_pool=str(warm_pool)), start_new_session=True,
    )  # fmt: skip


def _send(proc: subprocess.Popen[bytes], *messages: dict[str, Any]) -> None:
    assert proc.stdin is not None
    for message in messages:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def _running(engine: DockerEngine) -> list[str]:
    return [container.id for container in worker_containers(engine) if container.state == "running"]


def _wait_until(condition: object, within: float, what: str, engine: DockerEngine | None = None) -> None:
    """Until ``condition()``; past ``within`` seconds a failure that says ``what`` (and, given ``engine``, the state of
    each container this worker made)."""
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        if time.monotonic() >= deadline:
            left = [] if engine is None else [(c.state, c.labels.get(LABEL_RUNTIME)) for c in worker_containers(engine)]
            raise AssertionError(f"{what}; left: {left}")
        time.sleep(0.1)


def _end(proc: subprocess.Popen[bytes], how: str) -> None:
    if how == "sigkill":
        proc.kill()
    elif how == "sigkill-group":
        os.killpg(proc.pid, signal.SIGKILL)
    elif how == "codex":  # what Codex does at exit: SIGTERM and stdin closed at once, the group killed right after
        proc.send_signal(signal.SIGTERM)
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        time.sleep(0.014)
        os.killpg(proc.pid, signal.SIGKILL)
    elif how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        assert proc.stdin is not None
        proc.stdin.close()
    proc.wait(timeout=30)


@pytest.mark.parametrize("how", ["sigkill", "sigkill-group", "codex", "sigterm", "stdin-closed"])
def test_a_servers_sandboxes_end_themselves_when_it_goes_however_it_goes(
    tmp_path: Path, engine: DockerEngine, how: str
) -> None:
    with _spawn(tmp_path, warm_pool=1) as proc:
        _send(proc, INITIALIZE)
        assert proc.stdout is not None
        proc.stdout.readline()
        _send(proc, INITIALIZED, CREATE)
        created = json.loads(proc.stdout.readline())
        assert created["result"]["isError"] is False
        # The session, and the warm container that refills the pool behind it.
        _wait_until(lambda: len(_running(engine)) == 2, 30, "the warm pool did not refill")
        _end(proc, how)
    # No other server starts: the sandboxes end, and are removed, by themselves.
    _wait_until(lambda: not worker_containers(engine), 20, f"a sandbox outlived its server ({how})")


def test_a_server_killed_at_any_moment_of_its_start_leaves_nothing_running(
    tmp_path: Path, engine: DockerEngine
) -> None:
    """Killed while the pool fills, while a sandbox is made for a call, or between a create and a start: what was
    started ends by itself. A container made and not yet started when its server died does not run (the next
    server's sweep removes it; here the test does)."""
    for delay in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0):
        with _spawn(tmp_path, warm_pool=2) as proc:
            _send(proc, INITIALIZE, INITIALIZED, CREATE)
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        never_started = lambda: all(c.state == "created" for c in worker_containers(engine))  # noqa: E731
        _wait_until(never_started, 20, f"a sandbox outlived its server killed after {delay}s", engine)
        for container in worker_containers(engine):  # made, never started: this worker's own, removed here
            engine.remove_container(container.id)


def test_under_gvisor_too_a_killed_servers_sandbox_ends_itself(tmp_path: Path, engine: DockerEngine) -> None:
    env = server_env(tmp_path, warm_pool="0", runtime="runsc")
    with subprocess.Popen(
        [CLI, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True,
    ) as proc:  # fmt: skip
        _send(proc, INITIALIZE, INITIALIZED, CREATE)
        assert proc.stdout is not None
        proc.stdout.readline()
        assert json.loads(proc.stdout.readline())["result"]["isError"] is False
        [sandbox] = worker_containers(engine)
        assert sandbox.labels[LABEL_RUNTIME] == "runsc"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    _wait_until(lambda: not worker_containers(engine), 20, "a gVisor sandbox outlived its server")
