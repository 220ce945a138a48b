"""Another client's sandbox, for CI to show that the suite leaves what it did not make alone.

``start`` leaves three managed containers of another client (tag ``foreign-client``): a live sandbox, made as a
separate server would (its own owner token, a lifetime longer than the suite), and two that any untagged sweep
would remove: one past its expiry and one that has exited. ``check`` fails unless all three are still there, then
removes them. ``.ci/run`` calls ``start`` before the tests and ``check`` after them.
"""

from __future__ import annotations

import sys

import anyio
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED, LABEL_TAG, ContainerRequest
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.settings import Settings

from tests.support.images import start_container

TAG = "foreign-client"


async def start() -> None:
    engine = DockerEngine(labels={LABEL_TAG: TAG})
    profile = select_profile(create_plugin_manager(), None)
    manager = SessionManager(engine, profile, Settings(max_lifetime=3600, idle_timeout=1800))
    session = await manager.create()  # not destroyed: the container outlives this process, as a live peer's would
    del session
    image = engine.image_facts(profile.image_spec().tag)
    assert image is not None  # the session above could not have started without it
    image_id = image.id
    apparmor = engine.daemon_facts().apparmor
    watchdog = [*profile.helper_argv("watchdog"), "3600"]
    expired = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: "1"}
    engine.create_container(ContainerRequest(image_id, watchdog, expired, apparmor))
    exited = engine.create_container(
        ContainerRequest(image_id, ["/usr/local/bin/node", "-e", "0"], {LABEL_MANAGED: "true"}, apparmor), start=False
    )
    start_container(engine, exited)  # created without auto-remove: it exits and stays


def check() -> int:
    engine = DockerEngine()
    containers = engine.list_containers(f"{LABEL_MANAGED}=true", f"{LABEL_TAG}={TAG}")
    for container in containers:
        engine.remove_container(container.id)
    states = sorted(c.state for c in containers)
    if states != ["exited", "running", "running"]:
        sys.stderr.write(f"another client's containers did not survive the suite: {states}\n")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        anyio.run(start)
    elif sys.argv[1:] == ["check"]:
        sys.exit(check())
    else:
        sys.exit("usage: python -m tests.support.foreign_client start|check")
