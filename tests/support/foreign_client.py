"""Another client's sandbox, for CI to show that the suite leaves what it did not make alone.

``start`` creates one managed sandbox as a separate server would (its own owner token, the tag ``foreign-client``,
a lifetime longer than the suite) and leaves it running; ``check`` fails unless it is still there and running, then
removes it. ``.ci/run`` calls ``start`` before the tests and ``check`` after them.
"""

from __future__ import annotations

import sys

import anyio
from code_sandbox.engine import DockerEngine
from code_sandbox.hardening import LABEL_MANAGED, LABEL_TAG
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sessions import SessionManager
from code_sandbox.settings import Settings

TAG = "foreign-client"


async def start() -> None:
    engine = DockerEngine(labels={LABEL_TAG: TAG})
    settings = Settings(max_lifetime=3600, idle_timeout=1800)
    manager = SessionManager(engine, select_profile(create_plugin_manager(), None), settings)
    await manager.create()  # not destroyed: the container outlives this process, as a live peer's would


def check() -> int:
    engine = DockerEngine()
    containers = engine.list_containers(f"{LABEL_MANAGED}=true", f"{LABEL_TAG}={TAG}")
    for container in containers:
        engine.remove_container(container.id)
    if [c.state for c in containers] != ["running"]:
        sys.stderr.write(f"another client's sandbox did not survive the suite: {[c.state for c in containers]}\n")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        anyio.run(start)
    elif sys.argv[1:] == ["check"]:
        sys.exit(check())
    else:
        sys.exit("usage: python -m tests.support.foreign_client start|check")
