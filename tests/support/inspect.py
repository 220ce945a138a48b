"""The engine's whole inspect document of a container, for tests that compare settings with what was asked."""

from __future__ import annotations

from typing import Any, cast

from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import Engine


def docker_of(engine: Engine) -> DockerEngine:
    """The Docker adapter behind a session manager's engine (the suite's managers all have one)."""
    assert isinstance(engine, DockerEngine)
    return engine


def inspect_container(engine: Engine, container_id: str) -> dict[str, Any]:
    return cast(dict[str, Any], docker_of(engine).client().inspect_container(container_id))
