"""The engine's whole inspect document of a container, for tests that compare settings with what was asked."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import Engine


def docker_of(engine: Engine) -> DockerEngine:
    """The Docker adapter behind a session manager's engine (the suite's managers all have one)."""
    assert isinstance(engine, DockerEngine)
    return engine


def inspect_container(engine: Engine, container_id: str) -> dict[str, Any]:
    return cast(dict[str, Any], docker_of(engine).client().inspect_container(container_id))


def memory_usage(engine: Engine, container_id: str) -> int:
    """The container's memory cgroup usage in bytes, as the engine reads it on the host: under gVisor, everything its
    kernel holds for the sandbox (processes, files, socket buffers) is there."""
    stats = cast(dict[str, Any], docker_of(engine).client().stats(container_id, stream=False))
    return int(stats["memory_stats"]["usage"])


def oom_events(engine: Engine, container_id: str, *, since: int, until: int) -> int:
    """How many ``oom`` events the engine reported for the container between two wall-clock seconds."""
    events = (
        docker_of(engine)
        .client()
        .events(since=since, until=until, filters={"container": container_id, "event": "oom"}, decode=True)
    )
    return sum(1 for _event in cast(Iterable[object], events))
