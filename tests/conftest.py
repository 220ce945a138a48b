"""Shared fixtures and the run's bookkeeping. Docker tests never skip in CI: with ``CI=true`` an unreachable engine
fails them.

The suite runs in parallel (pytest-xdist). Each worker tags what it creates (:mod:`tests.support.run`) and removes
only that; a test marked ``serial`` waits until no other test runs and holds every other worker off while it runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.image import build_offline_image, verify_image
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.profile import Profile
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.snapshot_store import LABEL_SNAPSHOT
from code_sandbox.settings import Settings

from tests.support.run import (
    RUN_DIR_ENV,
    RUN_ENV,
    containers_of_run,
    hold_test_slot,
    image_lock,
    live_children,
    new_run_id,
    remove_tagged,
    run_id,
    stray_files,
    worker_tag,
)


def _start_run() -> None:
    """In the controller (or the only process), before anything else: choose the run's id and its directory.

    Workers inherit both through the environment. Every temporary file of the run, pytest's tmp_path included, goes
    under that one directory (``TMPDIR``), so the final check sees what the run and the code under test left there
    without looking at the rest of /tmp.
    """
    if RUN_ENV in os.environ:
        return
    os.environ[RUN_ENV] = new_run_id()
    run_dir = tempfile.mkdtemp(prefix=f"code-sandbox-{run_id()}-")
    os.environ[RUN_DIR_ENV] = run_dir
    os.environ["TMPDIR"] = run_dir
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


_start_run()  # at import, so that WORKER_TAG below already names this run
WORKER_TAG = worker_tag()
TEST_LABEL = "io.code-sandbox.test"
pytest_plugins = ["tests.support.second_engine"]  # the ``second_engine`` fixture


# -- the run ------------------------------------------------------------------------------------------------------


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Twice the cores this process may use, at most 8: most tests wait on the Docker engine, not on a CPU."""
    del config
    return min(8, 2 * len(os.sched_getaffinity(0)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests first, so that no worker starts one near the end; serial tests last, when holding the other
    workers off costs little. A ``runc_only`` test is not collected for gVisor's runtime: what it attacks does not
    exist there (its reason says what)."""
    absent = [item for item in items if item.get_closest_marker("runc_only") and _runtime(item) == "runsc"]
    if absent:
        config.hook.pytest_deselected(items=absent)
        items[:] = [item for item in items if item not in absent]

    def order(item: pytest.Item) -> int:
        return 2 if item.get_closest_marker("serial") else 0 if item.get_closest_marker("slow") else 1

    items.sort(key=order)


def _runtime(item: pytest.Item) -> object:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("engine")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every worker is done: nothing this run created is left on the engine or in the run's directory."""
    if hasattr(session.config, "workerinput"):
        return
    problems: list[str] = []
    engine = DockerEngine()
    try:
        leftovers = containers_of_run(engine, run_id())
    except SandboxError:
        leftovers = []  # no engine: the Docker tests said so already
    for container in leftovers:
        problems.append(f"container tagged {container.labels[LABEL_TAG]} ({container.state}) outlived the run")
        with contextlib.suppress(SandboxError):
            engine.remove_container(container.id)
    try:
        snapshots = [
            s for s in engine.list_snapshots(LABEL_SNAPSHOT) if s.labels.get(LABEL_TAG, "").startswith(run_id())
        ]
    except SandboxError:
        snapshots = []
    for snapshot in snapshots:
        problems.append(f"snapshot tagged {snapshot.labels[LABEL_TAG]} outlived the run")
        with contextlib.suppress(SandboxError):
            engine.remove_snapshot(snapshot.id)
    engine.close()
    run_dir = Path(os.environ[RUN_DIR_ENV])
    problems += [f"temporary file left in the run's directory: {name}" for name in stray_files(run_dir)]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.section("left behind by this run", sep="=", red=True)
            for problem in problems:
                reporter.line(problem)
            reporter.line(f"the run's temporary directory is kept: {run_dir}")
    elif exitstatus == 0:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif reporter is not None:
        reporter.line(f"the run's temporary directory is kept: {run_dir}")


@pytest.fixture(autouse=True)
def _serial_gate(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under xdist, a ``serial`` test waits until no other test runs, and no other test starts until it is done."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with hold_test_slot(Path(os.environ[RUN_DIR_ENV]), serial=request.node.get_closest_marker("serial") is not None):
        yield


# -- the engine and the image -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def engine() -> Iterator[DockerEngine]:
    """The Docker engine; every container made through it carries this worker's tag.

    At the end of the worker's session, a container still tagged for it is an error (and is removed).
    """
    engine = DockerEngine(labels={LABEL_TAG: WORKER_TAG})
    try:
        engine.ping()
    except SandboxError:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and the Docker engine is unreachable: Docker tests must run in CI")
        pytest.skip("no reachable Docker engine (set CI=true to make this a failure)")
    yield engine
    left = remove_tagged(engine, WORKER_TAG)
    engine.close()
    assert left == 0, f"{left} container(s) of this worker outlived their tests"


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_worker() -> Iterator[None]:
    yield
    assert live_children(os.getpid()) == [], "a process started by a test outlived it"


@pytest.fixture(scope="session")
def profile() -> Profile:
    return select_profile(create_plugin_manager(), None)


@pytest.fixture(scope="session")
def image_id(engine: DockerEngine, profile: Profile) -> str:
    """The verified sandbox image; built once when missing or stale (CI builds it before the tests)."""
    return ready_image(engine, profile)


def ready_image(engine: DockerEngine, profile: Profile) -> str:
    """The profile's verified image ID, built offline first when it is missing or fails verification.

    One worker at a time: otherwise every worker would build its own image at once and all but the last would
    lose the tag. A verified ID is recorded for the run, so each profile's image is checked once per run.
    """
    with image_lock() as verified:
        record = verified.read_text().splitlines() if verified.is_file() else []
        image = engine.image_facts(profile.image_spec().tag)
        if image is None or f"{profile.name} {image.id}" not in record:
            report = verify_image(engine, profile)
            if not report.passed:
                build_offline_image(engine, profile, runtime=None, progress=lambda _text: None)
                report = verify_image(engine, profile)
            assert report.passed, [check for check in report.checks if not check.passed]
            assert report.image is not None
            image = report.image
            with verified.open("a") as out:  # another worker of this run trusts this ID
                out.write(f"{profile.name} {image.id}\n")
    engine.verified_images.add((profile.name, image.id))  # every manager on this engine may trust it
    return image.id


@pytest.fixture
def cleanup_managed(engine: DockerEngine) -> Iterator[None]:
    """Remove the containers a test of this worker leaves behind, even when it fails; nobody else's."""
    yield
    remove_tagged(engine, WORKER_TAG)


@pytest.fixture
def snapshots_removed(engine: DockerEngine) -> Iterator[None]:
    """Remove the snapshots of this worker's servers after the test, tagged or not; nobody else's."""
    yield
    for stored in engine.list_snapshots(f"{LABEL_TAG}={WORKER_TAG}"):
        if LABEL_SNAPSHOT in stored.labels:
            engine.remove_snapshot(stored.id)


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
