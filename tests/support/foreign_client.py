"""Another client's sandbox, for CI to show that the suite leaves what it did not make alone.

``start`` leaves three managed containers of another client (tag ``foreign-client``): a live sandbox, held by a
peer process that stays up for the suite as another client's server would (its own owner token, its own lifeline:
a sandbox ends when its server goes), and two that any untagged sweep would remove: one past its expiry and one
that has exited. ``check`` fails unless all three are still there, then stops the peer and removes them.
``.ci/run`` calls ``start`` before the tests and ``check`` after them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED, LABEL_TAG, ContainerRequest
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.settings import Settings

from tests.support.images import start_container

TAG = "foreign-client"
PEER_LIFETIME = 3600
READY = "ready"
# Named so that nothing the suite cleans up could match it.
PEER_PIDFILE = Path(tempfile.gettempdir()) / "foreign-client-peer.pid"


async def peer() -> None:
    """Hold one live sandbox, as another client's server would, until stopped or ``PEER_LIFETIME`` passes."""
    engine = DockerEngine(labels={LABEL_TAG: TAG})
    profile = select_profile(create_plugin_manager(), None)
    manager = SessionManager(engine, profile, Settings(max_lifetime=PEER_LIFETIME, idle_timeout=PEER_LIFETIME))
    session = await manager.create()
    del session  # never destroyed here: it ends with this process, through its lifeline
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the starter stops reading: nothing more may block on the pipe
    os.dup2(devnull, 2)
    await anyio.sleep(PEER_LIFETIME)


def start() -> int:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.foreign_client", "peer"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    assert process.stdout is not None
    said: list[str] = []
    for line in process.stdout:
        if line.strip() == READY:
            break
        said.append(line)
    else:
        sys.stderr.write("the foreign client's peer ended before its sandbox started:\n" + "".join(said))
        return 1
    PEER_PIDFILE.write_text(f"{process.pid}\n")
    leave_dead_containers()
    return 0


def leave_dead_containers() -> None:
    engine = DockerEngine(labels={LABEL_TAG: TAG})
    profile = select_profile(create_plugin_manager(), None)
    image = engine.image_facts(profile.image_spec().tag)
    assert image is not None  # the peer's sandbox could not have started without it
    apparmor = engine.daemon_facts().apparmor
    watchdog = [*profile.helper_argv("watchdog"), str(PEER_LIFETIME)]
    expired = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: "1"}
    engine.create_container(ContainerRequest(image.id, watchdog, expired, apparmor))
    exited = engine.create_container(
        ContainerRequest(image.id, ["/usr/local/bin/node", "-e", "0"], {LABEL_MANAGED: "true"}, apparmor), start=False
    )
    start_container(engine, exited)  # created without auto-remove: it exits and stays


def check() -> int:
    engine = DockerEngine()
    containers = engine.list_containers(f"{LABEL_MANAGED}=true", f"{LABEL_TAG}={TAG}")
    states = sorted(c.state for c in containers)
    stop_peer()
    for container in containers:
        engine.remove_container(container.id)
    if states != ["exited", "running", "running"]:
        sys.stderr.write(f"another client's containers did not survive the suite: {states}\n")
        return 1
    return 0


def stop_peer() -> None:
    try:
        pid = int(PEER_PIDFILE.read_text())
    except (OSError, ValueError):
        return
    PEER_PIDFILE.unlink()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


if __name__ == "__main__":
    command = sys.argv[1:]
    if command == ["start"]:
        sys.exit(start())
    elif command == ["peer"]:
        anyio.run(peer)
    elif command == ["check"]:
        sys.exit(check())
    else:
        sys.exit("usage: python -m tests.support.foreign_client start|check")
