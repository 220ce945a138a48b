"""Shared fixtures. Docker tests never skip in CI: with ``CI=true`` an unreachable engine fails them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_MANAGED
from code_sandbox.image import build_offline_image, verify_image
from code_sandbox.plugins import Profile, create_plugin_manager, select_profile
from code_sandbox.sessions import SessionManager
from code_sandbox.settings import Settings

TEST_LABEL = "io.code-sandbox.test"
# What /tmp held before any test ran; the final check shows that the suite added nothing outside its own dirs.
TMP_SNAPSHOT = frozenset(entry.name for entry in Path("/tmp").iterdir())


@pytest.fixture(scope="session")
def engine() -> Iterator[DockerEngine]:
    engine = DockerEngine()
    try:
        engine.ping()
    except SandboxError:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and the Docker engine is unreachable: Docker tests must run in CI")
        pytest.skip("no reachable Docker engine (set CI=true to make this a failure)")
    yield engine
    _remove_labelled(engine, TEST_LABEL)
    engine.close()


def _remove_labelled(engine: DockerEngine, label: str) -> None:
    for container in engine.list_containers(label):
        with contextlib.suppress(SandboxError):
            engine.remove_container(container.id)


@pytest.fixture(scope="session")
def profile() -> Profile:
    return select_profile(create_plugin_manager(), None)


@pytest.fixture(scope="session")
def image_id(engine: DockerEngine, profile: Profile) -> str:
    """The verified sandbox image; built once when missing or stale (CI builds it before the tests)."""
    report = verify_image(engine, profile)
    if not report.passed:
        build_offline_image(engine, profile, runtime=None, progress=lambda _text: None)
        report = verify_image(engine, profile)
    assert report.passed, [check for check in report.checks if not check.passed]
    assert report.image is not None
    return report.image.id


@pytest.fixture
def cleanup_managed(engine: DockerEngine) -> Iterator[None]:
    """Remove every managed container a test leaves behind, even when it fails."""
    yield
    _remove_labelled(engine, LABEL_MANAGED)


@pytest.fixture
async def manager(engine: DockerEngine, profile: Profile, image_id: str) -> AsyncIterator[SessionManager]:
    """A session manager on the verified image, shut down (its containers removed) after the test."""
    del image_id
    manager = SessionManager(engine, profile, Settings(max_sessions=4, default_timeout=10, max_timeout=60))
    yield manager
    await manager.shutdown()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
