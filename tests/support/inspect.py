"""The engine's whole inspect document of a container, for tests that compare settings with what was asked."""

from __future__ import annotations

from typing import Any, cast

from code_sandbox.engine import DockerEngine


def inspect_container(engine: DockerEngine, container_id: str) -> dict[str, Any]:
    return cast(dict[str, Any], engine.api().inspect_container(container_id))
