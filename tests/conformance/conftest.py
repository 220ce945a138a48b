"""The profiles under test: every profile in the repository, each on its own verified image."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import code_sandbox_python.profile
import pytest
from code_sandbox.engine import DockerEngine
from code_sandbox.plugins import create_plugin_manager, installed_profiles
from code_sandbox.profile import Profile
from code_sandbox.sessions import SessionManager
from code_sandbox.settings import Settings

from tests.conformance.programs import PROGRAMS, Programs
from tests.conftest import ready_image
from tests.support.run import worker_tag
from tests.support.runtimes import TEST_RUNTIMES, runtime_engine

# The installed plugins (javascript-offline) and the example python-offline profile, registered from its source
# tree as its entry point would register it: it is not installed, so that the product keeps one profile.
REPOSITORY_PROFILES = installed_profiles(create_plugin_manager(plugins=[code_sandbox_python.profile]))


@pytest.fixture(scope="session", params=TEST_RUNTIMES)
def engine(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """Every profile's promises hold under each container runtime: the host's kernel (runc) and gVisor's (runsc)."""
    yield from runtime_engine(request.param, worker_tag())


@pytest.fixture(scope="session", params=sorted(REPOSITORY_PROFILES))
def conformance_profile(request: pytest.FixtureRequest) -> Profile:
    return REPOSITORY_PROFILES[request.param]


@pytest.fixture
def programs(conformance_profile: Profile) -> Programs:
    return PROGRAMS[conformance_profile.name]


@pytest.fixture
async def sandboxes(engine: DockerEngine, conformance_profile: Profile) -> AsyncIterator[SessionManager]:
    """A session manager for the profile under test, on its verified image; shut down after the test."""
    ready_image(engine, conformance_profile)
    manager = SessionManager(engine, conformance_profile, Settings(max_sessions=2, default_timeout=10, max_timeout=60))
    yield manager
    await manager.shutdown()
