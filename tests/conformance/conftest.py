"""The profiles under test: every profile in the repository, each on its own verified image, on every kind of engine:
the shared local engine under each container runtime, a Docker engine reached over TLS on loopback as a remote one
is, and Podman's Docker-compatible API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import code_sandbox_python.profile
import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.image import verify_image
from code_sandbox.plugins import create_plugin_manager, installed_profiles
from code_sandbox.profile import Profile
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.settings import Settings

from tests.conformance.programs import PROGRAMS, Programs
from tests.conftest import ready_image
from tests.support.engines import TEST_ENGINES, podman_engine
from tests.support.images import tag_image
from tests.support.run import remove_tagged, worker_tag
from tests.support.runtimes import TEST_RUNTIMES, runtime_engine
from tests.support.second_engine import SecondEngine, load_image

# The installed plugins (javascript-offline) and the example python-offline profile, registered from its source
# tree as its entry point would register it: it is not installed, so that the product keeps one profile.
REPOSITORY_PROFILES = installed_profiles(create_plugin_manager(plugins=[code_sandbox_python.profile]))


@pytest.fixture(scope="session", params=[*TEST_RUNTIMES, *TEST_ENGINES])
def engine(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """Every profile's promises hold under each container runtime of the local engine (the host's kernel, runc;
    gVisor's, runsc), on an engine reached over TLS (``tls``) and on Podman (``podman``)."""
    kind = str(request.param)
    if kind not in ("tls", "podman"):
        yield from runtime_engine(kind, worker_tag())
        return
    shared = DockerEngine(labels={LABEL_TAG: worker_tag()})  # where the images are built and verified first
    if kind == "tls":
        second: SecondEngine = request.getfixturevalue("second_engine")
        engine = second.tls_engine(labels={LABEL_TAG: worker_tag()})
        _provide_images(shared, engine, second.provide_image)
        try:
            yield engine
        finally:
            left = remove_tagged(engine, worker_tag())
            engine.close()
            shared.close()
            assert left == 0, f"{left} container(s) of this worker outlived their tests on the TLS engine"
        return
    for engine in podman_engine(worker_tag()):
        _provide_images(shared, engine, None)
        shared.close()
        yield engine


def _provide_images(shared: DockerEngine, engine: DockerEngine, provide: Callable[..., None] | None) -> None:
    """Copy every profile's verified image from the shared engine, then verify it where it now is."""
    for profile in REPOSITORY_PROFILES.values():
        image_id = ready_image(shared, profile)
        if provide is not None:
            provide(shared, image_id, profile.image_spec().tag)
        else:
            if engine.image_facts(image_id) is None:
                load_image(shared, engine, image_id)
            tag_image(engine, image_id, profile.image_spec().tag)
        report = verify_image(engine, profile)
        assert report.passed, [check for check in report.checks if not check.passed]
        engine.verified_images.add((profile.name, image_id))


@pytest.fixture(scope="session", params=sorted(REPOSITORY_PROFILES))
def conformance_profile(request: pytest.FixtureRequest) -> Profile:
    return REPOSITORY_PROFILES[request.param]


@pytest.fixture
def programs(conformance_profile: Profile) -> Programs:
    return PROGRAMS[conformance_profile.name]


@pytest.fixture
async def sandboxes(engine: DockerEngine, conformance_profile: Profile) -> AsyncIterator[SessionManager]:
    """A session manager for the profile under test, on its verified image; shut down after the test."""
    ready_image(engine, conformance_profile)  # this profile's (another profile's verified image is not it)
    manager = SessionManager(engine, conformance_profile, Settings(max_sessions=2, default_timeout=10, max_timeout=60))
    yield manager
    await manager.shutdown()
